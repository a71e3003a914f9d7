//! Every path a command can take to the module (issue 18 item 1): [`Path`] on one server,
//! [`Carry`] from one place to another; a codec for the module's `DUMP` payloads
//! ([`ModuleDump`]: hostile fields in a valid CRC64); and a stepped wall clock.

use std::path::{Path as FsPath, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::resp::{RawConn, Resp};
use crate::server::{Server, ServerBuilder};
use crate::{target_dir, wait_until};

/// `enum Name { Variant => "name", ... }` with `ALL` (every variant) and `name()`.
macro_rules! named {
    ($(#[$doc:meta])* $ty:ident { $($v:ident => $name:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $ty { $($v),* }

        impl $ty {
            pub const ALL: [$ty; [$($name),*].len()] = [$($ty::$v),*];

            pub fn name(self) -> &'static str {
                match self { $($ty::$v => $name),* }
            }
        }
    };
}

named!(
    /// How a command reaches the module on one server (`ModuleCall`: `RedisModule_Call`
    /// from the helper module).
    Path {
        Direct => "direct",
        Pipelined => "pipelined",
        Multi => "multi",
        Eval => "eval",
        Fcall => "fcall",
        ModuleCall => "module-call",
    }
);

named!(
    /// How a read-only script reaches the module (`EVAL_RO`, `FCALL_RO` of a `no-writes`
    /// function): the module's read commands answer as directly, its writes are refused.
    ReadOnlyPath {
        EvalRo => "eval_ro",
        FcallRo => "fcall_ro",
    }
);

named!(
    /// How the state a command made travels elsewhere (`Replica`: the stream to an
    /// attached replica; `FullSync`: a new replica's first sync).
    Carry {
        Replica => "replica-stream",
        AofReplay => "aof-replay",
        Restore => "dump-restore",
        FullSync => "full-sync",
    }
);

/// The script every [`Path::Eval`] call runs: the command line is `ARGV`.
pub const EVAL_SCRIPT: &str = "return redis.call(unpack(ARGV))";

/// The function library [`Path::Fcall`] calls (`FCALL lockpaths_call 0 cmd args...`),
/// and [`ReadOnlyPath::FcallRo`] its `no-writes` twin (`FCALL_RO lockpaths_read 0 ...`).
pub const FUNCTION_LIBRARY: &str = "#!lua name=lockpaths\n\
redis.register_function('lockpaths_call', function(keys, args) return redis.call(unpack(args)) end)\n\
redis.register_function{function_name='lockpaths_read', \
callback=function(keys, args) return redis.call(unpack(args)) end, flags={'no-writes'}}";

/// Loads [`FUNCTION_LIBRARY`] into a server (`FUNCTION LOAD REPLACE`); panics when refused.
pub fn load_function_library(c: &mut RawConn) {
    let r = c.cmd(&["FUNCTION", "LOAD", "REPLACE", FUNCTION_LIBRARY]);
    assert_eq!(r, Resp::Bulk(b"lockpaths".to_vec()), "FUNCTION LOAD");
}

/// Sends `argv` by `path` and returns the command's own reply. [`Path::Fcall`] needs
/// [`load_function_library`] first, [`Path::ModuleCall`] [`with_helper_module`].
pub fn send<A: AsRef<[u8]>>(c: &mut RawConn, path: Path, argv: &[A]) -> Resp {
    let argv: Vec<Vec<u8>> = argv.iter().map(|a| a.as_ref().to_vec()).collect();
    let wrapped = |prefix: &[&[u8]]| -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = prefix.iter().map(|p| p.to_vec()).collect();
        v.extend(argv.iter().cloned());
        v
    };
    match path {
        Path::Direct => c.cmd(&argv),
        Path::Pipelined => {
            let ping = vec![b"PING".to_vec()];
            let replies = c
                .pipeline(&[ping.clone(), argv.clone(), ping])
                .unwrap_or_else(|e| panic!("pipeline: {e}"));
            assert_eq!(replies.len(), 3, "pipeline replies {replies:?}");
            replies[1].clone()
        }
        Path::Multi => {
            let replies = c
                .pipeline(&[
                    vec![b"MULTI".to_vec()],
                    argv.clone(),
                    vec![b"EXEC".to_vec()],
                ])
                .unwrap_or_else(|e| panic!("MULTI/EXEC: {e}"));
            assert_eq!(replies[0], Resp::Simple("OK".into()), "MULTI");
            match &replies[1] {
                Resp::Simple(s) if s == "QUEUED" => {}
                other => return other.clone(),
            }
            match &replies[2] {
                Resp::Array(items) if items.len() == 1 => items[0].clone(),
                other => other.clone(),
            }
        }
        Path::Eval => c.cmd(&wrapped(&[b"EVAL", EVAL_SCRIPT.as_bytes(), b"0"])),
        Path::Fcall => c.cmd(&wrapped(&[b"FCALL", b"lockpaths_call", b"0"])),
        Path::ModuleCall => c.cmd(&wrapped(&[b"HELPER.CALL"])),
    }
}

/// Sends `argv` from a read-only script and returns the command's own reply (an error for
/// a write command). [`ReadOnlyPath::FcallRo`] needs [`load_function_library`] first.
pub fn send_read_only<A: AsRef<[u8]>>(c: &mut RawConn, path: ReadOnlyPath, argv: &[A]) -> Resp {
    let mut v: Vec<Vec<u8>> = match path {
        ReadOnlyPath::EvalRo => vec![b"EVAL_RO".to_vec(), EVAL_SCRIPT.into(), b"0".to_vec()],
        ReadOnlyPath::FcallRo => vec![
            b"FCALL_RO".to_vec(),
            b"lockpaths_read".to_vec(),
            b"0".to_vec(),
        ],
    };
    v.extend(argv.iter().map(|a| a.as_ref().to_vec()));
    c.cmd(&v)
}

/// The helper module's `.so` (testkit/helper-module), built by cargo on a process's first
/// call. Panics when the build fails.
pub fn helper_module_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let workspace = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let args = ["build", "--release", "-q", "-p", "redis-lock-helper-module"];
        build(
            Command::new(cargo).current_dir(&workspace).args(args),
            "the helper module",
        );
        let so = target_dir().join("release/libredis_lock_helper.so");
        assert!(so.is_file(), "{} missing after the build", so.display());
        so.canonicalize().unwrap_or(so)
    })
    .clone()
}

/// Runs the build of `what`; panics with its output when it fails.
fn build(cmd: &mut Command, what: &str) {
    let out = (cmd.output()).unwrap_or_else(|e| panic!("cannot run the build of {what}: {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "building {what} failed: {err}");
}

/// `b` with the helper module loaded beside the lock module.
pub fn with_helper_module(b: ServerBuilder) -> ServerBuilder {
    let so = helper_module_path();
    b.arg("loadmodule", &so.to_string_lossy())
}

/// Waits until `replica`'s `slave_repl_offset` reaches `primary`'s `master_repl_offset`.
pub fn wait_replica_caught_up(primary: &Server, replica: &Server, timeout: Duration) -> bool {
    let want: u64 = primary
        .info_field("replication", "master_repl_offset")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    wait_until(timeout, || {
        replica
            .info_field("replication", "slave_repl_offset")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|o| o >= want)
    })
}

/// `LOCK.INFO key` without the fields that may differ where its state was carried (`ttl`,
/// `waiters`, `cursor`; `ttl` in each holder too); None when free.
pub fn durable_info(c: &mut RawConn, key: &str) -> Option<Vec<(String, Resp)>> {
    let r = c.cmd(&["LOCK.INFO", key]);
    if r == Resp::Nil {
        return None;
    }
    let pairs = r
        .try_pairs()
        .unwrap_or_else(|| panic!("LOCK.INFO {key}: {r:?}"));
    Some(without(&pairs, &["ttl", "waiters", "cursor"], "ttl"))
}

/// `info` without the fields `top`, and without `inner` in each holder of `holder-list`.
fn without(info: &[(String, Resp)], top: &[&str], inner: &str) -> Vec<(String, Resp)> {
    let holder = |h: &Resp| match h.try_pairs() {
        Some(p) => Resp::Array(
            p.into_iter()
                .filter(|(k, _)| k != inner)
                .flat_map(|(k, v)| [Resp::Bulk(k.into_bytes()), v])
                .collect(),
        ),
        None => h.clone(),
    };
    info.iter()
        .filter(|(k, _)| !top.contains(&k.as_str()))
        .map(|(k, v)| match k == "holder-list" {
            true => (
                k.clone(),
                Resp::Array(v.items().iter().map(holder).collect()),
            ),
            false => (k.clone(), v.clone()),
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// DUMP payloads of the module's values.

/// CRC-64/Jones as Redis computes it for DUMP payloads (reflected, init 0).
pub fn crc64(data: &[u8]) -> u64 {
    const POLY_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ POLY_REFLECTED
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// RDB object type of a module value saved with typed opcodes (module API v2).
pub const RDB_TYPE_MODULE_2: u8 = 7;
const OP_EOF: u64 = 0;
const OP_UINT: u64 = 2;
const OP_STRING: u64 = 5;

/// One typed field of a module value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Uint(u64),
    Str(Vec<u8>),
}

/// A decoded `DUMP` payload of a module value (module id: type name and encoding version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleDump {
    pub module_id: u64,
    pub ops: Vec<Op>,
    pub rdb_version: [u8; 2],
}

fn read_len(b: &[u8], pos: &mut usize) -> Option<u64> {
    let first = *b.get(*pos)?;
    *pos += 1;
    let mut be = |n: usize| -> Option<u64> {
        let v = b
            .get(*pos..*pos + n)?
            .iter()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
        *pos += n;
        Some(v)
    };
    match first >> 6 {
        0 => Some(u64::from(first & 0x3f)),
        1 => Some((u64::from(first & 0x3f) << 8) | be(1)?),
        2 if first == 0x80 => be(4),
        2 if first == 0x81 => be(8),
        _ => None,
    }
}

fn write_len(out: &mut Vec<u8>, v: u64) {
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.push(0x40 | (v >> 8) as u8);
        out.push(v as u8);
    } else if v <= u64::from(u32::MAX) {
        out.push(0x80);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

impl ModuleDump {
    /// Decodes a payload (type, module id, typed fields, EOF, version, CRC64).
    pub fn parse(p: &[u8]) -> Result<ModuleDump, String> {
        if p.len() <= 11 {
            return Err("payload too short".into());
        }
        let body = &p[..p.len() - 8];
        let mut crc = [0u8; 8];
        crc.copy_from_slice(&p[p.len() - 8..]);
        if crc64(body) != u64::from_le_bytes(crc) {
            return Err("CRC64 mismatch".into());
        }
        if p[0] != RDB_TYPE_MODULE_2 {
            return Err(format!("object type {}", p[0]));
        }
        let mut pos = 1;
        let module_id = read_len(p, &mut pos).ok_or("module id")?;
        let mut ops = Vec::new();
        loop {
            match read_len(p, &mut pos).ok_or("opcode")? {
                OP_EOF => break,
                OP_UINT => ops.push(Op::Uint(read_len(p, &mut pos).ok_or("uint")?)),
                OP_STRING => {
                    let n = read_len(p, &mut pos).ok_or("string length")? as usize;
                    let s = p.get(pos..pos + n).ok_or("string")?;
                    ops.push(Op::Str(s.to_vec()));
                    pos += n;
                }
                op => return Err(format!("opcode {op} at {}", pos - 1)),
            }
        }
        if pos + 2 != body.len() {
            return Err("trailing bytes after EOF".into());
        }
        Ok(ModuleDump {
            module_id,
            ops,
            rdb_version: [p[pos], p[pos + 1]],
        })
    }

    /// Encodes the value back, with a fresh CRC64.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![RDB_TYPE_MODULE_2];
        write_len(&mut out, self.module_id);
        for op in &self.ops {
            match op {
                Op::Uint(v) => {
                    write_len(&mut out, OP_UINT);
                    write_len(&mut out, *v);
                }
                Op::Str(s) => {
                    write_len(&mut out, OP_STRING);
                    write_len(&mut out, s.len() as u64);
                    out.extend_from_slice(s);
                }
            }
        }
        write_len(&mut out, OP_EOF);
        out.extend_from_slice(&self.rdb_version);
        let crc = crc64(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// The encoding version (low 10 bits of the module id).
    pub fn encver(&self) -> u64 {
        self.module_id & 1023
    }

    /// The same value under another encoding version.
    pub fn with_encver(&self, v: u64) -> ModuleDump {
        ModuleDump {
            module_id: (self.module_id & !1023) | (v & 1023),
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_is_redis_check_value() {
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    #[test]
    fn payloads_round_trip() {
        let d = ModuleDump {
            module_id: (12345 << 10) | 2,
            ops: vec![Op::Uint(0), Op::Uint(1 << 40), Op::Str(b"abc".to_vec())],
            rdb_version: [11, 0],
        };
        let p = d.encode();
        assert_eq!(ModuleDump::parse(&p), Ok(d.clone()));
        assert_eq!(d.with_encver(1).encver(), 1);
        let mut bad = p.clone();
        bad[3] ^= 1;
        assert!(ModuleDump::parse(&bad).is_err());
    }
}

// ---------------------------------------------------------------------------------------
// A server's wall clock stepped by an LD_PRELOAD shim (monotonic clocks untouched, as NTP).

/// `target/reliability/libclockshift.so`, built by `gcc` from
/// `scripts/reliability/clockshift.c` when missing or older. Panics when it cannot be.
pub fn clock_shim_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let root = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let src = root.join("scripts/reliability/clockshift.c");
        let dir = target_dir().join("reliability");
        let lib = dir.join("libclockshift.so");
        let mtime = |p: &FsPath| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        if mtime(&lib).is_none() || mtime(&lib) < mtime(&src) {
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            let part = dir.join(format!("libclockshift.so.{}", std::process::id()));
            let gcc = ["-O2", "-Wall", "-shared", "-fPIC", "-o"];
            build(
                Command::new("gcc").args(gcc).arg(&part).arg(&src),
                "the clock shim",
            );
            std::fs::rename(&part, &lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
        }
        lib.canonicalize().unwrap_or(lib)
    })
    .clone()
}

/// The wall-clock offset of servers started with [`ClockShift::apply`]: a file the shim
/// maps, rewritten in place to step the clock at once.
#[derive(Debug)]
pub struct ClockShift {
    file: PathBuf,
}

impl ClockShift {
    /// A new offset file (offset 0) in `dir`.
    pub fn new(dir: &FsPath) -> ClockShift {
        let file = dir.join("clock-offset");
        let s = ClockShift { file };
        s.set_ms(0);
        s
    }

    /// `b` with the shim preloaded, reading this offset.
    pub fn apply(&self, b: ServerBuilder) -> ServerBuilder {
        b.env("LD_PRELOAD", &clock_shim_path().to_string_lossy())
            .env("CLOCKSHIFT_FILE", &self.file.to_string_lossy())
    }

    /// Steps the clock to `ms` milliseconds from the real one (either sign).
    pub fn set_ms(&self, ms: i64) {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        let text = format!("{ms:<40}\n");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.file)
            .unwrap_or_else(|e| panic!("{}: {e}", self.file.display()));
        f.write_all_at(text.as_bytes(), 0)
            .unwrap_or_else(|e| panic!("{}: {e}", self.file.display()));
        let _ = (&f).flush();
    }
}

/// How much later a carried lease may end (a restart or replay took time; never shorter).
pub const LATER_SLACK_MS: i64 = 10_000;
/// How much earlier a carried `expires-at` may read (a wall-clock estimate, per server).
pub const EARLIER_SLACK_MS: i64 = 200;

fn expires_of(info: &[(String, Resp)]) -> Vec<i64> {
    let mut out = Vec::new();
    for (k, v) in info {
        if k == "expires-at" {
            out.extend(v.as_int());
        }
        if k == "holder-list" {
            for h in v.as_items().unwrap_or_default() {
                if let Some(e) = h.get("expires-at").and_then(|e| e.as_int()) {
                    out.push(e);
                }
            }
        }
    }
    out
}

/// Compares two [`durable_info`]s: equal fields, each `expires-at` of `got` within
/// [-`EARLIER_SLACK_MS`, +`LATER_SLACK_MS`] of `want`'s. Err describes the difference.
pub fn same_state(
    want: &Option<Vec<(String, Resp)>>,
    got: &Option<Vec<(String, Resp)>>,
) -> Result<(), String> {
    match (want, got) {
        (None, None) => Ok(()),
        (Some(w), Some(g)) => {
            let bare = |i| without(i, &["expires-at"], "expires-at");
            if bare(w) != bare(g) {
                return Err(format!("fields differ:\n  want {w:?}\n  got  {g:?}"));
            }
            let (we, ge) = (expires_of(w), expires_of(g));
            let ok = we.len() == ge.len()
                && we
                    .iter()
                    .zip(&ge)
                    .all(|(w, g)| *g >= *w - EARLIER_SLACK_MS && *g <= *w + LATER_SLACK_MS);
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "expires-at {ge:?}, want {we:?} (-{EARLIER_SLACK_MS}/+{LATER_SLACK_MS} ms)"
                ))
            }
        }
        _ => Err(format!("want {want:?}, got {got:?}")),
    }
}
