//! The key-value store end to end: the generated client against a real server over loopback,
//! and the two example binaries against each other.

use futures_util::stream::{self, StreamExt};
use kvstore::kv::{self, event::Kind, mutation::Op};
use kvstore::{server_builder, KvStore};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use topspin::{Code, Request};

async fn start() -> (kv::StoreClient, topspin::ShutdownHandle) {
    let server = server_builder(KvStore::default())
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let address = server.local_addr().clone();
    let handle = server.shutdown_handle();
    tokio::spawn(server.serve());
    (kv::StoreClient::connect(address).await.unwrap(), handle)
}

fn put(key: &str, value: &str) -> kv::PutRequest {
    kv::PutRequest {
        key: key.into(),
        value: value.into(),
        expected_version: None,
    }
}

#[tokio::test]
async fn every_method() {
    tokio::time::timeout(Duration::from_secs(20), async {
        let (client, shutdown) = start().await;
        // Watch first, so the writes below show up on it.
        let mut watch = client
            .watch(Request::new(kv::WatchRequest {
                prefix: "user/".into(),
                include_existing: true,
            }))
            .await
            .unwrap()
            .into_inner();

        let v = client
            .put(Request::new(put("user/ann", "1")))
            .await
            .unwrap();
        assert_eq!(v.into_inner().version, 1);
        client.put(Request::new(put("other", "x"))).await.unwrap();
        let v = client
            .put(Request::new(put("user/ann", "2")))
            .await
            .unwrap();
        assert_eq!(v.into_inner().version, 2);

        // Compare-and-set.
        let mut cas = put("user/ann", "3");
        cas.expected_version = Some(1);
        let err = client.put(Request::new(cas)).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);

        let e = client
            .get(Request::new(kv::GetRequest {
                key: "user/ann".into(),
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((e.value.as_str(), e.version), ("2", 2));
        let err = client
            .get(Request::new(kv::GetRequest { key: "nope".into() }))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::NotFound);

        let d = client
            .delete(Request::new(kv::DeleteRequest {
                key: "user/ann".into(),
            }))
            .await
            .unwrap();
        assert!(d.into_inner().existed);

        // The watcher saw both puts under its prefix, then the delete; not `other`.
        let mut seen = Vec::new();
        for _ in 0..3 {
            let event = watch.message().await.unwrap().unwrap();
            seen.push(match event.kind.unwrap() {
                Kind::Put(e) => format!("put {}={}", e.key, e.value),
                Kind::Deleted(k) => format!("deleted {k}"),
            });
        }
        assert_eq!(
            seen,
            ["put user/ann=1", "put user/ann=2", "deleted user/ann"]
        );

        // Client streaming.
        let mutations = stream::iter([
            kv::Mutation {
                op: Some(Op::Put(put("a", "1"))),
            },
            kv::Mutation {
                op: Some(Op::Put(put("b", "2"))),
            },
            kv::Mutation {
                op: Some(Op::Delete(kv::DeleteRequest { key: "a".into() })),
            },
        ]);
        let summary = client
            .apply(Request::new(mutations))
            .await
            .unwrap()
            .into_inner();
        assert_eq!((summary.puts, summary.deletes), (2, 1));

        // Bidirectional: a missing key ends the stream with its status.
        let keys = stream::iter(["b", "other", "a"].map(|k| kv::GetRequest { key: k.into() }));
        let results: Vec<Result<String, Code>> = client
            .get_many(Request::new(keys))
            .await
            .unwrap()
            .into_inner()
            .map(|r| r.map(|e| e.value).map_err(|s| s.code()))
            .collect()
            .await;
        assert_eq!(
            results,
            [Ok("2".to_owned()), Ok("x".to_owned()), Err(Code::NotFound)]
        );

        // A new watcher starts with the current entries.
        let mut watch = client
            .watch(Request::new(kv::WatchRequest {
                prefix: String::new(),
                include_existing: true,
            }))
            .await
            .unwrap()
            .into_inner();
        let mut keys = Vec::new();
        for _ in 0..2 {
            if let Some(Kind::Put(e)) = watch.message().await.unwrap().unwrap().kind {
                keys.push(e.key);
            }
        }
        assert_eq!(keys, ["b", "other"]);
        drop(watch);
        shutdown.shutdown(Duration::from_secs(1)).await;
    })
    .await
    .expect("bounded");
}

/// Kills the child when the test ends, whatever happens.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the server binary on a free port; returns it and its address.
fn server_binary() -> (Child, String) {
    let mut server = Child(
        Command::new(env!("CARGO_BIN_EXE_kvstore-server"))
            .arg("tcp://127.0.0.1:0")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The server prints its address once it listens: that line is the synchronisation.
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    (server, address)
}

#[test]
fn server_and_client_binaries() {
    let (_server, address) = server_binary();

    let client = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kvstore-client"))
            .arg(&address)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    assert_eq!(client(&["put", "k", "v"]).1, "version 1\n");
    assert_eq!(client(&["get", "k"]).1, "k = v (version 1)\n");
    assert_eq!(client(&["apply", "x=1", "y=2"]).1, "2 puts, 0 deletes\n");
    assert_eq!(
        client(&["get-many", "x", "y"]).1,
        "x = 1 (version 1)\ny = 2 (version 1)\n"
    );
    assert_eq!(client(&["delete", "k"]).1, "deleted\n");
    let (code, _, err) = client(&["get", "k"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("NOT_FOUND"), "{err}");
}

/// SIGTERM — what process managers, systemd and Kubernetes send — drains the server like
/// Ctrl-C: a GOAWAY, no new calls, in-flight calls get the grace period, then exit 0. (It used
/// to kill the process at once.)
#[test]
fn sigterm_drains_and_exits_zero() {
    let (mut server, address) = server_binary();
    // A watch stays open: the server must give it the grace period rather than die under it.
    let mut watch = Child(
        Command::new(env!("CARGO_BIN_EXE_kvstore-client"))
            .args([address.as_str(), "watch"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let pid = server.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the server did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status after SIGTERM: {status:?}");
    // It drained: the open watch was held for the grace period (5 s), not cut at once.
    assert!(t0.elapsed() >= Duration::from_secs(4), "{:?}", t0.elapsed());
    let _ = watch.0.kill();
}
