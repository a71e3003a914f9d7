//! A network namespace of a run's own and nft link cuts inside it (needs root, `ip`
//! and `nft`). Servers go into the namespace with [`ServerBuilder::netns`](crate::ServerBuilder::netns).

use std::net::Ipv4Addr;

use crate::run_cmd;

/// A network namespace with its loopback up; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> Result<Netns, String> {
        let _ = run_cmd(&["ip", "netns", "del", name]);
        run_cmd(&["ip", "netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn exec(&self, argv: &[&str]) -> Result<String, String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(argv);
        run_cmd(&full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run_cmd(&["ip", "netns", "del", &self.name]);
    }
}

/// Drops TCP between two addresses inside a namespace (nft); the table goes on drop.
pub struct LinkCut<'a> {
    ns: &'a Netns,
    cut: bool,
}

impl<'a> LinkCut<'a> {
    pub fn install(ns: &'a Netns) -> Result<LinkCut<'a>, String> {
        ns.exec(&["nft", "add", "table", "inet", "rlrel"])?;
        ns.exec(&[
            "nft",
            "add chain inet rlrel out { type filter hook output priority 0 ; policy accept ; }",
        ])?;
        Ok(LinkCut { ns, cut: false })
    }

    /// Starts dropping every packet from `replica` to `primary:port` and back.
    pub fn cut(&mut self, replica: Ipv4Addr, primary: Ipv4Addr, port: u16) -> Result<(), String> {
        let (p, r, m) = (port.to_string(), replica.to_string(), primary.to_string());
        for (src, dst, dir) in [(&r, &m, "dport"), (&m, &r, "sport")] {
            self.ns.exec(&[
                "nft", "add", "rule", "inet", "rlrel", "out", "ip", "saddr", src, "ip", "daddr",
                dst, "tcp", dir, &p, "drop",
            ])?;
        }
        self.cut = true;
        Ok(())
    }

    pub fn heal(&mut self) -> Result<(), String> {
        if self.cut {
            self.ns
                .exec(&["nft", "flush", "chain", "inet", "rlrel", "out"])?;
            self.cut = false;
        }
        Ok(())
    }
}

impl Drop for LinkCut<'_> {
    fn drop(&mut self) {
        let _ = self.ns.exec(&["nft", "delete", "table", "inet", "rlrel"]);
    }
}
