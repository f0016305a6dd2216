//! Where a server listens and a channel connects: `tcp://host:port`, `unix:///path`, (Linux)
//! an abstract Unix socket name `unix:@name`, `tls://host:port`, `ws://host:port/path`,
//! `wss://host:port/path` or (Linux) shared memory `shm://name`; for a
//! [`Channel`](crate::Channel) also `dns:///host:port` (every server a name resolves to) and,
//! calling an existing gRPC server, `grpc://host:port` (HTTP/2 without TLS) or
//! `grpcs://host:port` (HTTP/2 over TLS).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// A transport address.
///
/// ```
/// use topspin::Address;
/// let a: Address = "tcp://[::1]:50051".parse().unwrap();
/// assert_eq!(a, Address::Tcp("[::1]:50051".into()));
/// let u: Address = "unix:///run/kv.sock".parse().unwrap();
/// assert_eq!(u.to_string(), "unix:///run/kv.sock");
/// // A Linux abstract socket: a name, not a file.
/// let a: Address = "unix:@kv".parse().unwrap();
/// assert_eq!(a, Address::UnixAbstract("kv".into()));
/// assert_eq!(a.to_string(), "unix:@kv");
/// // Shared memory between processes of one host (Linux).
/// let s: Address = "shm://kv".parse().unwrap();
/// assert_eq!(s, Address::Shm("kv".into()));
/// // A bare host:port is TCP.
/// assert_eq!("127.0.0.1:80".parse::<Address>().unwrap(), Address::Tcp("127.0.0.1:80".into()));
/// assert!("http://x".parse::<Address>().is_err());
/// // Every server behind a DNS name (for channels; see `Balancing`).
/// let d: Address = "dns:///kv.default.svc.cluster.local:50051".parse().unwrap();
/// assert_eq!(d, Address::Dns("kv.default.svc.cluster.local:50051".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Address {
    /// TCP to `host:port` (a name, an IPv4 address, or an IPv6 address in brackets).
    Tcp(String),
    /// A Unix domain socket at a path.
    Unix(PathBuf),
    /// A Linux abstract Unix socket (`unix:@name`): a name in the network namespace, not a
    /// file, so there is nothing to clean up, lock or set permissions on; it disappears with
    /// the last socket bound to it. Anyone in the same network namespace can connect: check
    /// [`PeerAddr::credentials`](crate::PeerAddr::credentials) to authorise callers.
    UnixAbstract(String),
    /// TLS over TCP to `host:port` (`tls://host:port`; needs the `tls` feature to connect or
    /// bind).
    Tls(String),
    /// A WebSocket over TCP (`ws://host:port/path`): `host:port` and the path (`/` when the
    /// address names none). Needs the `websocket` feature.
    Ws(String, String),
    /// A WebSocket over TLS (`wss://host:port/path`). Needs the `tls` and `websocket` features.
    Wss(String, String),
    /// An existing gRPC server at `host:port`, called over HTTP/2 without TLS (prior
    /// knowledge, `grpc://host:port`): a [`Channel`](crate::Channel) speaks gRPC to it instead
    /// of the topspin protocol. A client address only: a topspin server answers gRPC on its
    /// `tcp://` port when its gRPC face is on.
    Grpc(String),
    /// An existing gRPC server at `host:port` over TLS with ALPN `h2` (`grpcs://host:port`;
    /// needs the `tls` feature). A client address only.
    Grpcs(String),
    /// Every server a DNS name resolves to (`dns:///host:port`, gRPC's target syntax): a
    /// channel to it balances over all A and AAAA records over TCP (over TLS, checking the
    /// certificates against the name, when the endpoint has TLS settings), resolving the name
    /// again on an interval and when a connection fails (see [`Balancing`](crate::Balancing)).
    /// Only for connecting: a server cannot bind it.
    Dns(String),
    /// Shared memory between two processes of one host (`shm://name`, Linux): a ring per
    /// direction in a memfd both map, set up over the abstract Unix socket
    /// `topspin-shm:<name>` (which anyone in the network namespace can connect to, as with
    /// `unix:@name`: check [`PeerAddr::credentials`](crate::PeerAddr::credentials)).
    Shm(String),
}

impl Address {
    /// The `host:port` of a TCP, TLS or WebSocket address; `None` for a Unix socket.
    pub fn host_port(&self) -> Option<&str> {
        match self {
            Address::Tcp(hp)
            | Address::Tls(hp)
            | Address::Ws(hp, _)
            | Address::Wss(hp, _)
            | Address::Grpc(hp)
            | Address::Grpcs(hp)
            | Address::Dns(hp) => Some(hp),
            Address::Unix(_) | Address::UnixAbstract(_) | Address::Shm(_) => None,
        }
    }

    /// The host of a TCP, TLS or WebSocket address (without the brackets of an IPv6 address):
    /// the name a TLS client checks the server's certificate against.
    pub fn host(&self) -> Option<&str> {
        let hp = self.host_port()?;
        let (h, _) = hp.rsplit_once(':')?;
        Some(h.trim_start_matches('[').trim_end_matches(']'))
    }
}

/// Why an address string could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid address {input:?}: {reason} (expected tcp://host:port, unix:///path, unix:@name, \
     tls://host:port, ws://host:port/path, wss://host:port/path, shm://name, grpc://host:port, \
     grpcs://host:port or dns:///host:port)"
)]
pub struct AddressError {
    input: String,
    reason: &'static str,
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(s: &str) -> Result<Address, AddressError> {
        let parsed = parse_local(s)
            .or_else(|| parse_ws(s))
            .or_else(|| parse_dns(s))
            .unwrap_or_else(|| parse_host_port(s));
        parsed.map_err(|reason| AddressError {
            input: s.to_owned(),
            reason,
        })
    }
}

/// A result of parsing an address: the address, or why not.
type Parsed = Result<Address, &'static str>;

/// `unix://path`, `unix:path`, `unix:@name` and `shm://name`; `None`: another scheme.
fn parse_local(s: &str) -> Option<Parsed> {
    if let Some(name) = s.strip_prefix("unix:@") {
        return Some(if name.is_empty() {
            Err("empty abstract socket name")
        } else if name.len() > 107 {
            // sun_path holds 108 bytes, the first of which is the NUL that marks the name.
            Err("abstract socket name longer than 107 bytes")
        } else {
            Ok(Address::UnixAbstract(name.to_owned()))
        });
    }
    if let Some(name) = s.strip_prefix("shm://") {
        return Some(if name.is_empty() {
            Err("empty shared-memory name")
        } else if name.len() > 107 - "topspin-shm:".len() {
            // The abstract socket `topspin-shm:<name>` must fit sun_path (107 bytes after the
            // NUL that marks it abstract).
            Err("shared-memory name longer than 95 bytes")
        } else {
            Ok(Address::Shm(name.to_owned()))
        });
    }
    let path = s
        .strip_prefix("unix://")
        .or_else(|| s.strip_prefix("unix:"))?;
    Some(if path.is_empty() {
        Err("empty socket path")
    } else {
        Ok(Address::Unix(PathBuf::from(path)))
    })
}

/// `ws://host:port/path` and `wss://…`; `None`: another scheme.
fn parse_ws(s: &str) -> Option<Parsed> {
    for (scheme, secure) in [("ws://", false), ("wss://", true)] {
        if let Some(rest) = s.strip_prefix(scheme) {
            let (hp, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            if let Err(e) = check_host_port(hp) {
                return Some(Err(e));
            }
            let (hp, path) = (hp.to_owned(), path.to_owned());
            return Some(Ok(if secure {
                Address::Wss(hp, path)
            } else {
                Address::Ws(hp, path)
            }));
        }
    }
    None
}

/// `dns:///host:port` (no authority: the system's resolver) or `dns:host:port`; `None`:
/// another scheme.
fn parse_dns(s: &str) -> Option<Parsed> {
    let rest = s.strip_prefix("dns:")?;
    let hp = match rest.strip_prefix("//") {
        Some(r) => match r.strip_prefix('/') {
            Some(hp) => hp,
            None => {
                return Some(Err(
                    "a DNS server authority is not supported: use dns:///host:port",
                ))
            }
        },
        None => rest,
    };
    let hp = hp.trim_end_matches('/');
    Some(check_host_port(hp).map(|()| Address::Dns(hp.to_owned())))
}

/// `tls://`, `grpc://`, `grpcs://`, `tcp://host:port` or a bare `host:port`.
fn parse_host_port(s: &str) -> Parsed {
    type Make = fn(String) -> Address;
    for (scheme, make) in [
        ("tls://", Address::Tls as Make),
        ("grpc://", Address::Grpc),
        ("grpcs://", Address::Grpcs),
        ("tcp://", Address::Tcp),
    ] {
        if let Some(rest) = s.strip_prefix(scheme) {
            let hp = rest.trim_end_matches('/');
            check_host_port(hp)?;
            return Ok(make(hp.to_owned()));
        }
    }
    if s.contains("://") {
        return Err("unknown scheme");
    }
    let hp = s.trim_end_matches('/');
    check_host_port(hp)?;
    Ok(Address::Tcp(hp.to_owned()))
}

/// Checks `host:port` (a name, an IPv4 address, or an IPv6 address in brackets).
fn check_host_port(hostport: &str) -> Result<(), &'static str> {
    {
        let err = |reason| reason;
        let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
            let Some((v6, after)) = rest.split_once(']') else {
                return Err(err("unclosed '[' in IPv6 address"));
            };
            if v6.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(err("invalid IPv6 address"));
            }
            let Some(port) = after.strip_prefix(':') else {
                return Err(err("missing :port"));
            };
            (v6, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h, p),
                Some(_) => return Err(err("IPv6 addresses go in brackets, e.g. [::1]:50051")),
                None => return Err(err("missing :port")),
            }
        };
        if host.is_empty() {
            return Err(err("empty host"));
        }
        if port.parse::<u16>().is_err() {
            return Err(err("port must be a number 0..=65535"));
        }
        Ok(())
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Tcp(hp) => write!(f, "tcp://{hp}"),
            Address::Unix(p) => write!(f, "unix://{}", p.display()),
            Address::UnixAbstract(name) => write!(f, "unix:@{name}"),
            Address::Tls(hp) => write!(f, "tls://{hp}"),
            Address::Ws(hp, path) => write!(f, "ws://{hp}{path}"),
            Address::Wss(hp, path) => write!(f, "wss://{hp}{path}"),
            Address::Grpc(hp) => write!(f, "grpc://{hp}"),
            Address::Grpcs(hp) => write!(f, "grpcs://{hp}"),
            Address::Dns(hp) => write!(f, "dns:///{hp}"),
            Address::Shm(name) => write!(f, "shm://{name}"),
        }
    }
}

/// Anything that names an [`Address`]: a string such as `"tcp://127.0.0.1:50051"`, an
/// `Address`, or a `SocketAddr`.
pub trait IntoAddress {
    /// The address, or why the string is not one.
    fn into_address(self) -> Result<Address, AddressError>;
}

impl IntoAddress for Address {
    fn into_address(self) -> Result<Address, AddressError> {
        Ok(self)
    }
}

impl IntoAddress for &Address {
    fn into_address(self) -> Result<Address, AddressError> {
        Ok(self.clone())
    }
}

impl IntoAddress for &str {
    fn into_address(self) -> Result<Address, AddressError> {
        self.parse()
    }
}

impl IntoAddress for String {
    fn into_address(self) -> Result<Address, AddressError> {
        self.parse()
    }
}

impl IntoAddress for &String {
    fn into_address(self) -> Result<Address, AddressError> {
        self.parse()
    }
}

impl IntoAddress for std::net::SocketAddr {
    fn into_address(self) -> Result<Address, AddressError> {
        Ok(Address::from(self))
    }
}

impl TryFrom<&str> for Address {
    type Error = AddressError;
    fn try_from(s: &str) -> Result<Address, AddressError> {
        s.parse()
    }
}

impl TryFrom<String> for Address {
    type Error = AddressError;
    fn try_from(s: String) -> Result<Address, AddressError> {
        s.parse()
    }
}

impl TryFrom<&String> for Address {
    type Error = AddressError;
    fn try_from(s: &String) -> Result<Address, AddressError> {
        s.parse()
    }
}

impl From<std::net::SocketAddr> for Address {
    fn from(a: std::net::SocketAddr) -> Address {
        Address::Tcp(a.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        for (s, want) in [
            ("tcp://localhost:1", Address::Tcp("localhost:1".into())),
            ("tcp://127.0.0.1:0/", Address::Tcp("127.0.0.1:0".into())),
            ("[::1]:9", Address::Tcp("[::1]:9".into())),
            ("unix:rel.sock", Address::Unix("rel.sock".into())),
            ("unix:@svc", Address::UnixAbstract("svc".into())),
            ("unix:@a/b c", Address::UnixAbstract("a/b c".into())),
            (
                "unix:///tmp/a b.sock",
                Address::Unix("/tmp/a b.sock".into()),
            ),
            ("tls://localhost:443", Address::Tls("localhost:443".into())),
            (
                "grpc://127.0.0.1:50051",
                Address::Grpc("127.0.0.1:50051".into()),
            ),
            ("grpcs://[::1]:443/", Address::Grpcs("[::1]:443".into())),
            ("ws://h:80", Address::Ws("h:80".into(), "/".into())),
            ("shm://kv", Address::Shm("kv".into())),
            ("dns:///h:1", Address::Dns("h:1".into())),
            ("dns:h:1/", Address::Dns("h:1".into())),
            (
                "wss://[::1]:443/rpc/x",
                Address::Wss("[::1]:443".into(), "/rpc/x".into()),
            ),
        ] {
            if s.starts_with("tls")
                || s.starts_with("wss")
                || s.starts_with("grpc://")
                || s.starts_with("shm")
            {
                assert_eq!(want.to_string(), s, "round trip");
            }
            assert_eq!(s.parse::<Address>().unwrap(), want, "{s}");
        }
        for bad in [
            "tcp://:80",
            "tcp://host",
            "tcp://host:99999",
            "::1:80",
            "[::1:80",
            "[zz]:80",
            "unix://",
            "unix:@",
            "http://x:1",
            "tls://host",
            "grpc://host",
            "grpcs://:1",
            "ws://:80/x",
            "shm://",
            "unix:",
            "dns://8.8.8.8/h:1",
            "dns:///h",
        ] {
            let e = bad.parse::<Address>().unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        let long = format!("unix:@{}", "x".repeat(108));
        assert!(long.parse::<Address>().is_err());
        let longest = format!("unix:@{}", "x".repeat(107));
        assert!(longest.parse::<Address>().is_ok());
        assert!(format!("shm://{}", "x".repeat(95))
            .parse::<Address>()
            .is_ok());
        assert!(format!("shm://{}", "x".repeat(96))
            .parse::<Address>()
            .is_err());
    }
}
