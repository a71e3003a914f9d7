//! Where a node's commands go and how a connection to it is opened: one server (a URL,
//! or an application's own `redis::Client`), a Redis Cluster (routed by key), or the
//! primary a Sentinel names (asked anew for every connection, so that a failover is
//! followed). TLS certificates from [`ClientOptions::tls`](crate::ClientOptions).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, FromRedisValue, TlsCertificates};
use tokio::sync::Mutex;

use crate::error::{Error, Result};
use crate::options::ClientOptions;

/// An open connection: to one server, or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Plain(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> redis::RedisResult<T> {
        match self {
            Conn::Plain(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// A keyless command (`WAIT`, `ROLE`, `INFO`, `CONFIG GET`) sent where `key` lives:
    /// on a cluster, to the master of its slot over the connection that carried the
    /// key's commands (which is what `WAIT` counts).
    pub async fn query_at<T: FromRedisValue>(
        &mut self,
        cmd: &Cmd,
        key: &str,
    ) -> redis::RedisResult<T> {
        match self {
            Conn::Plain(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                let v = c.route_command(cmd.clone(), routing).await?;
                Ok(T::from_redis_value(v)?)
            }
        }
    }
}

/// Where a node's commands go.
pub(crate) enum Target {
    Plain(redis::Client),
    /// The seed URL and certificates; a cluster client is built per connection, with
    /// that connection's time limits.
    Cluster {
        url: String,
        certs: Option<TlsCertificates>,
    },
    /// The primary of a Sentinel-watched service.
    Sentinel(Mutex<SentinelClient>),
}

/// What a URL says about the server, for messages: `host:port` (never the URL, which
/// may hold a password), and for TLS the address to probe when a handshake fails.
pub(crate) struct Reached {
    pub target: Target,
    pub label: String,
    pub tls_addr: Option<(String, u16)>,
}

/// `url` without the user name and password (`redis://host:port/db`); `"<the URL>"`
/// when it does not parse (then it cannot be cleaned reliably).
pub fn redact_url(url: &str) -> String {
    if let Some(s) = SentinelUrl::parse(url) {
        return s.map_or_else(|_| "<the URL>".into(), |s| s.shown());
    }
    match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "<the URL>".into(),
    }
}

/// The usage error for a URL that does not parse (never echoed: it may hold a password).
fn not_a_url(url: &str) -> Error {
    Error::Invalid(format!(
        "{} is not a server URL; write redis://HOST:PORT, rediss://HOST:PORT for TLS, \
         redis+sentinel://HOST:PORT/SERVICE for the primary a Sentinel names, or \
         unix:///path/to/socket",
        redact_url(url)
    ))
}

fn tls_addr(addr: &ConnectionAddr) -> Option<(String, u16)> {
    match addr {
        ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// The crypto provider of TLS connections: ring, unless the application installed one
/// (rustls cannot choose by itself when its build has more than one).
fn tls_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Reached {
    /// The target of `url`: a Sentinel service (`redis+sentinel://`), a cluster seed
    /// (`cluster`), or one server. Nothing is connected.
    pub fn from_url(url: &str, opts: &ClientOptions, cluster: bool) -> Result<Reached> {
        let certs = opts.tls.as_ref().map(|t| t.certificates());
        tls_crypto();
        if let Some(s) = SentinelUrl::parse(url) {
            return s?.reached(certs);
        }
        let client = match (&certs, url.starts_with("rediss://")) {
            (Some(c), true) => redis::Client::build_with_tls(url, c.clone()),
            _ => redis::Client::open(url),
        }
        .map_err(|_| not_a_url(url))?;
        let addr = client.get_connection_info().addr().clone();
        let target = if cluster {
            // Validate now; connections are made on first use.
            cluster_client(
                url,
                certs.clone(),
                Duration::from_secs(1),
                Duration::from_secs(1),
            )
            .map_err(|_| not_a_url(url))?;
            Target::Cluster {
                url: url.to_string(),
                certs,
            }
        } else {
            Target::Plain(client)
        };
        Ok(Reached {
            label: addr.to_string(),
            tls_addr: tls_addr(&addr),
            target,
        })
    }

    /// An application's own client, used as it is (its TLS, credentials, database).
    pub fn from_client(client: redis::Client) -> Reached {
        tls_crypto();
        let addr = client.get_connection_info().addr().clone();
        Reached {
            label: addr.to_string(),
            tls_addr: tls_addr(&addr),
            target: Target::Plain(client),
        }
    }
}

fn cluster_client(
    url: &str,
    certs: Option<TlsCertificates>,
    connect: Duration,
    response: Duration,
) -> redis::RedisResult<ClusterClient> {
    let mut b = ClusterClientBuilder::new(vec![url.to_string()])
        .connection_timeout(connect)
        .response_timeout(response);
    if let Some(c) = certs {
        b = b.certs(c);
    }
    b.build()
}

impl Target {
    /// Opens a connection within `connect`; `response` limits each reply on it (`None`:
    /// no limit of its own, the caller bounds every call).
    pub async fn open(
        &self,
        connect: Duration,
        response: Option<Duration>,
    ) -> redis::RedisResult<Conn> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(response);
        match self {
            Target::Plain(client) => client
                .get_multiplexed_async_connection_with_config(&cfg)
                .await
                .map(Conn::Plain),
            Target::Cluster { url, certs } => {
                let response = response.unwrap_or(Duration::from_secs(3600 * 24));
                let client = cluster_client(url, certs.clone(), connect, response)?;
                client.get_async_connection().await.map(Conn::Cluster)
            }
            Target::Sentinel(sentinel) => {
                // Asked for every connection: after a failover it names the new primary.
                let client = sentinel.lock().await.async_get_client().await?;
                client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await
                    .map(Conn::Plain)
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster { .. })
    }

    pub fn is_sentinel(&self) -> bool {
        matches!(self, Target::Sentinel(_))
    }
}

/// `redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]`: the primary
/// of `service` as the Sentinels at those addresses name it (`rediss+sentinel://` for
/// TLS to the Sentinels and the primary). The user and password are the primary's.
#[derive(Debug, PartialEq, Eq)]
struct SentinelUrl {
    tls: bool,
    insecure: bool,
    sentinels: Vec<(String, u16)>,
    service: String,
    db: i64,
    user: Option<String>,
    password: Option<String>,
}

impl SentinelUrl {
    /// `None`: not a Sentinel URL; `Some(Err)`: one that does not parse.
    fn parse(url: &str) -> Option<Result<SentinelUrl>> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
            (false, r)
        } else {
            (true, url.strip_prefix("rediss+sentinel://")?)
        };
        Some(Self::parse_rest(tls, rest).ok_or_else(|| {
            Error::Invalid(
                "a Sentinel URL is redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]\
                 /SERVICE[/DB]"
                    .into(),
            )
        }))
    }

    fn parse_rest(tls: bool, rest: &str) -> Option<SentinelUrl> {
        let (rest, insecure) = match rest.strip_suffix("#insecure") {
            Some(r) => (r, true),
            None => (rest, false),
        };
        let (authority, path) = rest.split_once('/')?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        // Empty means not given; a bad %-escape is a bad URL.
        let field = |s: &str| -> Option<Option<String>> {
            let text = percent_decode(s)?;
            Some((!text.is_empty()).then_some(text))
        };
        let (user, password) = match userinfo {
            Some(u) => {
                let (u, p) = u.split_once(':').unwrap_or((u, ""));
                (field(u)?, field(p)?)
            }
            None => (None, None),
        };
        let sentinels = hosts
            .split(',')
            .map(|h| {
                let (host, port) = h.rsplit_once(':')?;
                let host = host.trim_start_matches('[').trim_end_matches(']');
                (!host.is_empty()).then(|| Some((host.to_string(), port.parse().ok()?)))?
            })
            .collect::<Option<Vec<_>>>()?;
        let mut parts = path.trim_end_matches('/').split('/');
        let service = parts.next().filter(|s| !s.is_empty())?.to_string();
        let db = match parts.next() {
            Some(d) => d.parse().ok()?,
            None => 0,
        };
        if parts.next().is_some() {
            return None;
        }
        Some(SentinelUrl {
            tls,
            insecure,
            sentinels,
            service,
            db,
            user,
            password,
        })
    }

    /// The URL without credentials.
    fn shown(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect();
        let db = if self.db == 0 {
            String::new()
        } else {
            format!("/{}", self.db)
        };
        format!(
            "{scheme}+sentinel://{}/{}{db}",
            hosts.join(","),
            self.service
        )
    }

    fn reached(self, certs: Option<TlsCertificates>) -> Result<Reached> {
        let label = format!(
            "{} (via Sentinel {})",
            self.service,
            self.sentinels
                .iter()
                .map(|(h, p)| format!("{h}:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        );
        let addrs = self.sentinels.iter().map(|(host, port)| {
            if self.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: self.insecure,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let invalid = |e: redis::RedisError| {
            Error::Invalid(format!("{label}: {}", crate::error::scrub(&e.to_string())))
        };
        let mut b = SentinelClientBuilder::new(addrs, &self.service, SentinelServerType::Master)
            .map_err(invalid)?
            .set_client_to_redis_db(self.db);
        if let Some(u) = &self.user {
            b = b.set_client_to_redis_username(u);
        }
        if let Some(p) = &self.password {
            b = b.set_client_to_redis_password(p);
        }
        if self.tls {
            let mode = if self.insecure {
                redis::TlsMode::Insecure
            } else {
                redis::TlsMode::Secure
            };
            b = b.set_client_to_redis_tls_mode(mode);
            if let Some(c) = certs {
                b = b
                    .set_client_to_redis_certificates(c.clone())
                    .set_client_to_sentinel_certificates(c);
            }
        }
        Ok(Reached {
            target: Target::Sentinel(Mutex::new(b.build().map_err(invalid)?)),
            label,
            tls_addr: None,
        })
    }
}

/// `%XX` escapes decoded (a URL's user name and password); `None` for a bad escape or
/// text that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            out.push(u8::from_str_radix(s.get(i + 1..i + 3)?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            redact_url("redis://app:hunter2@10.0.0.1:6379/2"),
            "redis://10.0.0.1:6379/2"
        );
        assert_eq!(
            redact_url("rediss://:pw@h:1/#insecure"),
            "rediss://h:1/#insecure"
        );
        assert_eq!(redact_url("127.0.0.1:6379"), "<the URL>");
        assert_eq!(
            redact_url("redis+sentinel://u:hunter2@s1:26379,s2:26380/mymaster/2"),
            "redis+sentinel://s1:26379,s2:26380/mymaster/2"
        );
        assert_eq!(redact_url("redis+sentinel://:hunter2@s1/m"), "<the URL>");
    }

    #[test]
    fn sentinel_urls() {
        let p = |u: &str| SentinelUrl::parse(u).map(|r| r.ok());
        assert_eq!(p("redis://h:1/"), None, "not a Sentinel URL");
        let s = p("redis+sentinel://app:p%40ss@10.0.0.1:26379,[::1]:26380/orders/3")
            .flatten()
            .unwrap();
        assert_eq!(
            s,
            SentinelUrl {
                tls: false,
                insecure: false,
                sentinels: vec![("10.0.0.1".into(), 26379), ("::1".into(), 26380)],
                service: "orders".into(),
                db: 3,
                user: Some("app".into()),
                password: Some("p@ss".into()),
            }
        );
        let s = p("rediss+sentinel://h:1/m#insecure").flatten().unwrap();
        assert!(s.tls && s.insecure && s.user.is_none() && s.db == 0);
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h/m",
            "redis+sentinel://h:x/m",
            "redis+sentinel://h:1/m/x",
            "redis+sentinel://h:1/m/1/2",
            "redis+sentinel://:%zz@h:1/m",
        ] {
            assert_eq!(p(bad), Some(None), "{bad}");
        }
        let e = SentinelUrl::parse("redis+sentinel://:hunter2@h/m").unwrap();
        assert!(!e.unwrap_err().to_string().contains("hunter2"));
    }
}
