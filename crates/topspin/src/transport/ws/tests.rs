use super::*;

#[test]
fn tells_an_upgrade_from_a_plain_request() {
    let up = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUPGRADE:  WebSocket \r\n\r\n";
    assert!(is_http(up) && is_upgrade(up));
    let list = b"GET / HTTP/1.1\r\nupgrade: h2c, websocket\r\n\r\n";
    assert!(is_upgrade(list));
    let plain = b"GET /rpc HTTP/1.1\r\nHost: x\r\nX-Upgrade: websocket\r\n\r\n";
    assert!(is_http(plain) && !is_upgrade(plain));
    assert!(!is_http(b"\x00\x01garbage\r\n\r\n"));
    assert!(!is_http(b"GET / HTTP/2\r\n\r\n"));
}

#[tokio::test]
async fn the_head_is_read_to_its_blank_line_and_replayed() {
    let (mut a, mut b) = tokio::io::duplex(64);
    let w = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        for part in [&b"GET / HTTP/1.1\r\nA: b\r"[..], b"\n\r", b"\nrest"] {
            a.write_all(part).await.unwrap();
        }
        a
    });
    let head = read_head(&mut b).await.unwrap();
    assert!(head.starts_with(b"GET / HTTP/1.1\r\nA: b\r\n\r\n"));
    let _a = w.await.unwrap();
    let mut r = Replay { head, inner: b };
    let mut got = vec![0u8; 20];
    use tokio::io::AsyncReadExt;
    r.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"GET / HTTP/1.1\r\nA: b");
}

#[tokio::test]
async fn an_endless_head_is_refused() {
    let (mut a, mut b) = tokio::io::duplex(1024);
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while a.write_all(&[b'x'; 512]).await.is_ok() {}
    });
    assert!(read_head(&mut b).await.unwrap_err().contains("passed"));
}

/// The upgrade's HTTP bytes are not part of a message: after the handshake, a connection on
/// which no message has begun waits for one without a frame deadline (the handshake's bytes
/// used to count as a message being received, so the first wait armed `frame_timeout` and a
/// timer stayed in the runtime's wheel, costing every park of the runtime).
#[tokio::test]
async fn the_handshake_is_not_a_message_being_received() {
    let config = crate::Config::default().with_frame_timeout(std::time::Duration::from_millis(50));
    let settings = WebSocketSettings::default().bounded_by(&config);
    let (a, b) = tokio::io::duplex(64 * 1024);
    let server = {
        let settings = settings.clone();
        tokio::spawn(async move { settings.accept(b, "/").await })
    };
    let mut client = settings.connect(a, "ws://localhost/").await.unwrap();
    let mut server = server.await.unwrap().unwrap();
    use tokio::io::AsyncReadExt;
    let mut byte = [0u8; 1];
    for side in [
        &mut client as &mut (dyn tokio::io::AsyncRead + Unpin + Send),
        &mut server,
    ] {
        // Nothing is sent: the read waits well past the frame timeout, and is not failed.
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(300), side.read(&mut byte)).await;
        assert!(waited.is_err(), "the read ended: {waited:?}");
    }
}
