//! Messages from 1 B to the 64 MiB default limit; 64 MiB + 1 is refused cleanly — over every
//! transport.

mod common;

use bytes::Bytes;
use common::*;
use topspin::codec::RawCodec;
use topspin::Request;

fn pattern(n: usize) -> Bytes {
    (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
}

/// Echoes a message of each size and checks it came back intact.
async fn echo_each(ch: &topspin::Channel, t: Transport, sizes: &[usize]) {
    for &n in sizes {
        let body = pattern(n);
        let r = within(60, ch.unary(RawCodec, UNARY, Request::new(body.clone())))
            .await
            .unwrap();
        assert!(
            r.into_inner() == body,
            "{t:?}: {n} bytes came back different"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sizes_from_one_byte_to_the_limit() {
    let skips = trim(&[], &[Transport::UnixAbstract, Transport::Wss]);
    each_transport(&skips, |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let sizes = [1, 1000, 65_536, 1 << 20, 16 << 20, (16 << 20) + 1, 64 << 20];
        echo_each(&ch, t, &sizes).await;
        server.stop().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_byte_over_the_default_limit_is_refused() {
    each_transport(&[], |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let err = ch
            .unary(RawCodec, UNARY, Request::new(pattern((64 << 20) + 1)))
            .await
            .unwrap_err();
        assert_over_servers_limit(t, &err, &[(64 << 20) + 1, 64 << 20]);
        assert_eq!(unary(&ch, UNARY, "after").await.unwrap(), bytes("after"));
        server.stop().await;
    })
    .await;
}

/// The runtime announces `MAX_FRAME_SIZE` = `max_message_size` (64 MiB), so by default no
/// message reaches it split. With the protocol's default of 16 MiB announced instead (as other
/// implementations do), messages above it go as a MESSAGE and CONTINUATIONs and still arrive
/// whole and intact, in both directions, over every transport of the native protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_above_a_smaller_announced_frame_size_arrive_split_and_whole() {
    assert_eq!(topspin::Config::default().max_frame_size(), 64 << 20);
    let protocol_default = topspin::Config::default().with_max_frame_size(16 << 20);
    let skips = [
        (
            Transport::Grpc,
            "MAX_FRAME_SIZE and CONTINUATION frames are the native protocol's: HTTP/2 frames gRPC",
        ),
        (
            Transport::GrpcTonic,
            "MAX_FRAME_SIZE and CONTINUATION frames are the native protocol's: HTTP/2 frames gRPC",
        ),
    ];
    let skips = trim(&skips, &[Transport::UnixAbstract, Transport::Wss]);
    let protocol_default = &protocol_default;
    each_transport(&skips, |t| async move {
        let server = serve(
            builder(Probe::default()).config(protocol_default.clone()),
            t,
        )
        .await;
        let ch = server
            .connect_with(|e| e.config(protocol_default.clone()))
            .await
            .unwrap();
        echo_each(&ch, t, &[(16 << 20) + 5, 40 << 20]).await;
        server.stop().await;
    })
    .await;
}

/// A large message is received into a buffer of its own, handed to the application as is; the
/// next large message reuses that allocation once the application dropped the first (no
/// fresh pages to fault in per message), and gets another while it is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_message_buffer_is_reused_once_the_application_dropped_it() {
    // The gRPC client mode keeps one buffer per connection for messages split over DATA
    // frames (grpc/framing.rs `Spare`), reused the same way.
    let skips = trim(&[], &[Transport::UnixAbstract, Transport::Wss]);
    each_transport(&skips, |t| async move {
        let server = serve(standard(Probe::default()), t).await;
        let ch = server.channel().await;
        let body = pattern(2 << 20);
        let call = || ch.unary(RawCodec, UNARY, Request::new(body.clone()));
        let first = within(30, call()).await.unwrap().into_inner();
        assert!(first == body, "{t:?}");
        let at = first.as_ptr();
        drop(first);
        let second = within(30, call()).await.unwrap().into_inner();
        assert!(second == body, "{t:?}");
        assert_eq!(
            second.as_ptr(),
            at,
            "{t:?}: the dropped buffer was not reused"
        );
        let third = within(30, call()).await.unwrap().into_inner();
        assert!(third == body, "{t:?}");
        assert_ne!(
            third.as_ptr(),
            second.as_ptr(),
            "{t:?}: a held buffer was reused"
        );
        drop((second, third));
        server.stop().await;
    })
    .await;
}
