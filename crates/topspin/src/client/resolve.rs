//! Name resolution for balanced channels: where a [`Resolver`] says the servers are.
//!
//! A resolver is a stream of endpoint sets: the first item is the initial set, each later item
//! replaces the whole set (the channel adds and removes subchannels for the difference; calls
//! in flight on a kept endpoint are not disturbed). Three come with topspin:
//!
//! - [`StaticResolver`]: a fixed list ([`Endpoint::balanced`](crate::Endpoint::balanced));
//! - [`DnsResolver`]: every A and AAAA record of a name (`dns:///host:port`), resolved again on
//!   an interval and when a connection fails;
//! - [`from_stream`]: any stream of sets — a Kubernetes endpoints watch, Consul, xDS.

use crate::{Address, Status};
use futures_util::stream::{self, BoxStream, StreamExt};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// A source of endpoint sets for a balanced channel.
///
/// `resolve` is called once per channel, the first time the channel is used: each item of the
/// stream is the complete set of server addresses at that moment (an error keeps the previous
/// set and is reported while no endpoint is known). When the stream ends the last set stays.
///
/// ```
/// use futures_util::stream::{BoxStream, StreamExt};
/// use topspin::resolve::Resolver;
/// use topspin::{Address, Status};
///
/// /// Endpoints pushed by a watcher (Kubernetes, Consul, xDS) through a watch channel.
/// struct Watched(tokio::sync::watch::Receiver<Vec<Address>>);
///
/// impl Resolver for Watched {
///     fn resolve(&self) -> BoxStream<'static, Result<Vec<Address>, Status>> {
///         let rx = self.0.clone();
///         futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
///             if !first && rx.changed().await.is_err() {
///                 return None; // the watcher is gone: keep the last set
///             }
///             let set = rx.borrow_and_update().clone();
///             Some((Ok(set), (rx, false)))
///         })
///         .boxed()
///     }
/// }
/// ```
pub trait Resolver: Send + Sync + 'static {
    /// The stream of endpoint sets (each item a complete set).
    fn resolve(&self) -> Sets;

    /// A hint that a connection to one of the endpoints failed, so the set may be stale:
    /// resolve again soon. The default does nothing.
    fn resolve_now(&self) {}
}

/// A fixed set of addresses.
#[derive(Clone, Debug)]
pub struct StaticResolver(Vec<Address>);

impl StaticResolver {
    /// A resolver that always answers `addresses`.
    pub fn new(addresses: Vec<Address>) -> StaticResolver {
        StaticResolver(addresses)
    }
}

impl Resolver for StaticResolver {
    fn resolve(&self) -> BoxStream<'static, Result<Vec<Address>, Status>> {
        stream::iter([Ok(self.0.clone())]).boxed()
    }
}

/// A stream of endpoint sets used as a [`Resolver`] (it can be resolved once: a channel calls
/// `resolve` once).
///
/// ```
/// use topspin::{resolve, Address, Endpoint};
/// let (tx, rx) = tokio::sync::mpsc::channel::<Vec<Address>>(4);
/// let sets = futures_util::stream::unfold(rx, |mut rx| async move {
///     rx.recv().await.map(|set| (Ok(set), rx))
/// });
/// let channel = Endpoint::with_resolver(resolve::from_stream(sets)).connect_lazy();
/// // Later: tx.send(vec!["tcp://10.0.0.7:50051".parse().unwrap()]).await
/// # drop((tx, channel));
/// ```
pub fn from_stream<S>(sets: S) -> impl Resolver
where
    S: futures_util::Stream<Item = Result<Vec<Address>, Status>> + Send + 'static,
{
    FromStream(Mutex::new(Some(sets.boxed())))
}

/// A stream of endpoint sets, as resolvers yield them.
pub type Sets = BoxStream<'static, Result<Vec<Address>, Status>>;

struct FromStream(Mutex<Option<Sets>>);

impl Resolver for FromStream {
    fn resolve(&self) -> BoxStream<'static, Result<Vec<Address>, Status>> {
        let taken = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        taken.unwrap_or_else(|| {
            stream::iter([Err(Status::failed_precondition(
                "this stream resolver was already used by another channel",
            ))])
            .boxed()
        })
    }
}

/// Every A and AAAA record of a name, through the system's resolver (tokio's `lookup_host`,
/// i.e. `getaddrinfo` on a blocking thread: `/etc/hosts`, nsswitch and the system's DNS
/// settings apply, as for every other program on the machine).
///
/// The name is resolved when the channel is first used, then every `interval` (default 30 s:
/// `getaddrinfo` does not report TTLs) and soon after a connection to one of its servers fails
/// or a call finds no server (at most once per `min_interval`, default 1 s). A failed lookup
/// keeps the previous set and is tried again after 1 s, doubling up to `interval`.
#[derive(Clone, Debug)]
pub struct DnsResolver {
    host_port: String,
    interval: Duration,
    min_interval: Duration,
    now: Arc<Notify>,
}

impl DnsResolver {
    /// A resolver for `host:port`.
    pub fn new(host_port: impl Into<String>) -> DnsResolver {
        DnsResolver {
            host_port: host_port.into(),
            interval: Duration::from_secs(30),
            min_interval: Duration::from_secs(1),
            now: Arc::new(Notify::new()),
        }
    }

    /// How often the name is resolved again (default 30 s).
    pub fn interval(mut self, interval: Duration) -> DnsResolver {
        self.interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The least time between two lookups, however often connections fail (default 1 s).
    pub fn min_interval(mut self, min: Duration) -> DnsResolver {
        self.min_interval = min;
        self
    }

    async fn lookup(host_port: &str) -> Result<Vec<Address>, Status> {
        let found = tokio::net::lookup_host(host_port)
            .await
            .map_err(|e| Status::unavailable(format!("could not resolve {host_port}: {e}")))?;
        let mut set: Vec<SocketAddr> = found.collect();
        set.sort();
        set.dedup();
        if set.is_empty() {
            return Err(Status::unavailable(format!(
                "{host_port} resolved to no address"
            )));
        }
        Ok(set.into_iter().map(Address::from).collect())
    }
}

impl Resolver for DnsResolver {
    fn resolve(&self) -> BoxStream<'static, Result<Vec<Address>, Status>> {
        let me = self.clone();
        // State: the resolver, and how many lookups in a row failed (None before the first).
        stream::unfold(
            (me, None),
            |(me, failed): (DnsResolver, Option<u32>)| async move {
                if let Some(failed) = failed {
                    // Wait for the interval (after failures: 1 s doubling up to it) or a hint,
                    // but never less than min_interval.
                    let wait = match failed {
                        0 => me.interval,
                        n => Duration::from_secs(1u64 << (n - 1).min(16)).min(me.interval),
                    };
                    tokio::time::sleep(me.min_interval).await;
                    tokio::select! {
                        _ = tokio::time::sleep(wait.saturating_sub(me.min_interval)) => {}
                        _ = me.now.notified() => {}
                    }
                }
                let set = DnsResolver::lookup(&me.host_port).await;
                let failed = match set {
                    Ok(_) => 0,
                    Err(_) => failed.unwrap_or(0).saturating_add(1),
                };
                Some((set, (me, Some(failed))))
            },
        )
        .boxed()
    }

    fn resolve_now(&self) {
        // A permit is stored if no lookup waits now: the next wait ends at once.
        self.now.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_lookup_is_tried_again_soon() {
        // The interval is ten minutes; after a failure the next lookup comes after ~1 s.
        let dns = DnsResolver::new("no-such-host.invalid:50051")
            .interval(Duration::from_secs(600))
            .min_interval(Duration::from_millis(10));
        let mut sets = dns.resolve();
        for _ in 0..2 {
            let set = tokio::time::timeout(Duration::from_secs(20), sets.next())
                .await
                .expect("a lookup within 20 s");
            let e = set.expect("an item").expect_err("no such host");
            assert_eq!(e.code(), crate::Code::Unavailable);
        }
    }

    #[tokio::test]
    async fn static_and_stream_resolvers() {
        let a: Address = "tcp://10.0.0.1:1".parse().expect("address");
        let fixed = StaticResolver::new(vec![a.clone()]);
        assert_eq!(
            fixed.resolve().next().await.map(|r| r.ok()),
            Some(Some(vec![a.clone()]))
        );
        let once = from_stream(stream::iter([Ok(vec![a.clone()])]));
        assert!(once.resolve().next().await.is_some_and(|r| r.is_ok()));
        // A second channel cannot take the same stream: it says so.
        let e = once
            .resolve()
            .next()
            .await
            .expect("an item")
            .expect_err("used");
        assert_eq!(e.code(), crate::Code::FailedPrecondition);
    }
}
