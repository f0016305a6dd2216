use super::*;

#[test]
fn origins_are_the_servers_own_or_listed() {
    let s = WebSocketSettings::default();
    assert!(s.origin_allowed("http://127.0.0.1:8080", Some("127.0.0.1:8080")));
    assert!(s.origin_allowed("https://Example.com", Some("example.com:443")));
    assert!(s.origin_allowed("http://example.com:80", Some("example.com")));
    assert!(s.origin_allowed("http://[::1]:9000", Some("[::1]:9000")));
    assert!(!s.origin_allowed("http://[::1]", Some("[::1]:9000")));
    assert!(!s.origin_allowed("https://evil.example", Some("127.0.0.1:8080")));
    assert!(!s.origin_allowed("http://example.com", Some("example.com:443")));
    assert!(!s.origin_allowed("http://127.0.0.1:8081", Some("127.0.0.1:8080")));
    assert!(!s.origin_allowed("null", Some("127.0.0.1:8080")));
    assert!(!s.origin_allowed("http://127.0.0.1:8080", None));
    let s = s.allow_origins(["https://app.example", "http://localhost:*"]);
    assert!(s.origin_allowed("https://app.example", Some("10.0.0.1:1")));
    assert!(s.origin_allowed("http://localhost:3000", Some("10.0.0.1:1")));
    assert!(!s.origin_allowed("http://localhost:", Some("10.0.0.1:1")));
    assert!(!s.origin_allowed("http://localhost:3000.evil", Some("10.0.0.1:1")));
    assert!(!s.origin_allowed("https://app.example.evil", Some("10.0.0.1:1")));
    let s = WebSocketSettings::default().allow_any_origin();
    assert!(s.origin_allowed("https://evil.example", Some("127.0.0.1:8080")));
}
