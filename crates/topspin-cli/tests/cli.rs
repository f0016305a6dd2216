//! The `topspin` binary against real servers over loopback and Unix sockets: the kvstore
//! example (with reflection) and a server without reflection (with `--proto`).

use kvstore::kv;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use topspin::codec::ProstCodec;
use topspin::{Request, Response, Server, ServerBuilder, ShutdownHandle};

/// A server on its own runtime, shut down on drop.
struct TestServer {
    runtime: tokio::runtime::Runtime,
    address: String,
    shutdown: ShutdownHandle,
}

impl TestServer {
    fn start(builder: ServerBuilder, address: &str) -> TestServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let server = runtime.block_on(builder.bind(address)).unwrap();
        let address = server.local_addr().to_string();
        let shutdown = server.shutdown_handle();
        runtime.spawn(server.serve());
        TestServer {
            runtime,
            address,
            shutdown,
        }
    }

    fn kvstore() -> TestServer {
        TestServer::start(
            kvstore::server_builder(kvstore::KvStore::default()),
            "tcp://127.0.0.1:0",
        )
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.runtime
            .block_on(self.shutdown.shutdown(Duration::from_millis(100)));
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `topspin` (bounded: every run gets `--timeout 10s` and a 30 s watchdog).
fn topspin(args: &[&str], stdin: Option<&str>) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .args(args)
        .args(["--timeout", "10s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).unwrap();
    }
    drop(input);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("topspin did not finish")
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn ok(args: &[&str], stdin: Option<&str>) -> String {
    let out = topspin(args, stdin);
    assert_eq!(out.code, 0, "topspin {args:?} failed: {}", out.stderr);
    out.stdout
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

fn kv_proto() -> (PathBuf, PathBuf) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/kvstore/proto");
    (root.join("kv/v1/kv.proto"), root)
}

#[test]
fn help_reads_well() {
    let out = ok(&["--help"], None);
    for word in [
        "list",
        "describe",
        "call",
        "--proto",
        "Exit status",
        "Examples",
    ] {
        assert!(out.contains(word), "--help lacks {word:?}:\n{out}");
    }
    let out = ok(&["call", "--help"], None);
    for word in [
        "--data",
        "--header",
        "@FILE",
        "JSON lines",
        "--timeout",
        "base64",
    ] {
        assert!(out.contains(word), "call --help lacks {word:?}:\n{out}");
    }
    let out = ok(&["health", "--help"], None);
    for word in ["--watch", "SERVING", "NOT_FOUND", "Exit status"] {
        assert!(out.contains(word), "health --help lacks {word:?}:\n{out}");
    }
    let out = topspin(&["frobnicate"], None);
    assert_eq!(out.code, 2);
}

#[test]
fn list_and_describe_through_reflection() {
    let server = TestServer::kvstore();
    let a = server.address.as_str();
    let out = ok(&["list", a], None);
    assert!(out.contains("\nkv.v1.Store\n  Get(kv.v1.GetRequest) returns (kv.v1.Entry)\n"));
    // The health service is described too, so `topspin call` can reach it.
    assert!(out.starts_with(
        "grpc.health.v1.Health\n  Check(grpc.health.v1.HealthCheckRequest) returns \
         (grpc.health.v1.HealthCheckResponse)\n"
    ));
    assert!(out.contains("  Watch(kv.v1.WatchRequest) returns (stream kv.v1.Event)\n"));
    assert!(out.contains("  GetMany(stream kv.v1.GetRequest) returns (stream kv.v1.Entry)\n"));
    assert!(out.contains("topspin.reflection.v1.Reflection\n"));

    let out = ok(&["describe", a, "kv.v1.Store"], None);
    assert!(out.starts_with("// Stores string values under string keys."));
    assert!(out.contains("service Store {\n"));
    assert!(out.contains("  rpc Apply(stream kv.v1.Mutation) returns (kv.v1.ApplySummary);\n"));

    let out = ok(&["describe", a, "kv.v1.Event"], None);
    assert!(out.contains("message Event {\n  // What happened.\n  oneof kind {\n"));
    assert!(out.contains("    kv.v1.Entry put = 1;\n"));

    let out = ok(&["describe", a, "kv.v1.PutRequest"], None);
    assert!(
        out.contains("  optional uint64 expected_version = 3;\n"),
        "{out}"
    );

    let out = ok(&["describe", a, "kv.v1.Store/Get"], None);
    assert!(out.ends_with("rpc Get(kv.v1.GetRequest) returns (kv.v1.Entry);\n"));

    let out = topspin(&["describe", a, "kv.v1.Nope"], None);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("nothing is named \"kv.v1.Nope\""));
    assert!(out.stderr.contains("kv.v1.Store"));
}

#[test]
fn unary_calls_with_every_input() {
    let server = TestServer::kvstore();
    let a = server.address.as_str();
    let out = ok(
        &[
            "call",
            a,
            "kv.v1.Store/Put",
            "-d",
            r#"{"key": "a", "value": "1"}"#,
        ],
        None,
    );
    assert_eq!(json(&out), json(r#"{"version": "1"}"#));

    // -d @file
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("req.json");
    std::fs::write(&file, r#"{"key": "a"}"#).unwrap();
    let at_file = format!("@{}", file.display());
    let out = ok(&["call", a, "kv.v1.Store/Get", "-d", &at_file], None);
    assert_eq!(
        json(&out),
        json(r#"{"key": "a", "value": "1", "version": "1"}"#)
    );

    // -d @- (stdin), proto field names, defaults.
    let out = ok(
        &[
            "call",
            a,
            "/kv.v1.Store/Put",
            "-d",
            "@-",
            "--proto-names",
            "--emit-defaults",
        ],
        Some(r#"{"key": "b", "value": "2", "expected_version": "0"}"#),
    );
    assert_eq!(json(&out), json(r#"{"version": "1"}"#));
    let out = ok(
        &[
            "call",
            a,
            "kv.v1.Store.Delete",
            "-d",
            r#"{"key": "zz"}"#,
            "--emit-defaults",
        ],
        None,
    );
    assert_eq!(json(&out), json(r#"{"existed": false}"#));
}

#[test]
fn errors_name_the_status_the_method_and_the_field() {
    let server = TestServer::kvstore();
    let a = server.address.as_str();

    let out = topspin(
        &["call", a, "kv.v1.Store/Get", "-d", r#"{"key": "zz"}"#],
        None,
    );
    assert_eq!(out.code, 64 + 5);
    assert_eq!(
        out.stderr,
        "topspin: error: NOT_FOUND (code 5): no key \"zz\"\n"
    );
    assert!(out.stdout.is_empty());

    let out = topspin(&["call", a, "kv.v1.Store/Gett"], None);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("has no method \"Gett\""));
    assert!(out.stderr.contains("kv.v1.Store/Get\n"));
    assert!(out.stderr.contains("kv.v1.Store/GetMany\n"));

    let out = topspin(&["call", a, "kv.v1.Stor/Get"], None);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("there is no service \"kv.v1.Stor\""));
    assert!(out.stderr.contains("  kv.v1.Store\n"));

    let out = topspin(
        &[
            "call",
            a,
            "kv.v1.Store/Put",
            "-d",
            r#"{"key": "a", "value": 5}"#,
        ],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("field `value`"), "{}", out.stderr);
    assert!(out.stderr.contains("kv.v1.PutRequest"), "{}", out.stderr);

    let out = topspin(
        &[
            "call",
            a,
            "kv.v1.Store/Apply",
            "-d",
            r#"{"put": {"key": "a", "vlue": "x"}}"#,
        ],
        None,
    );
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("field `put"), "{}", out.stderr);
    assert!(out.stderr.contains("vlue"), "{}", out.stderr);

    let out = topspin(&["call", a, "kv.v1.Store/Get", "-d", "{not json"], None);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("line 1 column"), "{}", out.stderr);

    // Compare-and-set failure carries its code.
    let out = topspin(
        &[
            "call",
            a,
            "kv.v1.Store/Put",
            "-d",
            r#"{"key": "a", "value": "1", "expectedVersion": "3"}"#,
        ],
        None,
    );
    assert_eq!(out.code, 64 + 9);
    assert!(out.stderr.contains("FAILED_PRECONDITION (code 9)"));

    // Nothing listens there.
    let out = topspin(&["list", "tcp://127.0.0.1:1"], None);
    assert_eq!(out.code, 64 + 14, "{}", out.stderr);
    assert!(out.stderr.contains("UNAVAILABLE"));

    let out = topspin(&["call", a, "kv.v1.Store/Get", "--timeout", "soon"], None);
    assert_eq!(out.code, 2);
}

#[test]
fn streams_as_json_lines() {
    let server = TestServer::kvstore();
    let a = server.address.as_str();

    // Client streaming, several values in -d.
    let out = ok(
        &[
            "call",
            a,
            "kv.v1.Store/Apply",
            "-d",
            r#"{"put": {"key": "x", "value": "1"}}
               {"put": {"key": "y", "value": "2"}} {"delete": {"key": "nope"}}"#,
        ],
        None,
    );
    assert_eq!(json(&out), json(r#"{"puts": 2}"#));

    // Client streaming from stdin lines.
    let out = ok(
        &["call", a, "kv.v1.Store/Apply"],
        Some("{\"put\": {\"key\": \"z\", \"value\": \"3\"}}\n\n{\"delete\": {\"key\": \"x\"}}\n"),
    );
    assert_eq!(json(&out), json(r#"{"puts": 1, "deletes": 1}"#));

    // Bidirectional from stdin: one JSON line out per line in.
    let out = ok(
        &["call", a, "kv.v1.Store/GetMany", "-d", "@-"],
        Some("{\"key\": \"y\"}\n{\"key\": \"z\"}\n"),
    );
    let lines: Vec<serde_json::Value> = out.lines().map(json).collect();
    assert_eq!(
        lines,
        [
            json(r#"{"key": "y", "value": "2", "version": "1"}"#),
            json(r#"{"key": "z", "value": "3", "version": "1"}"#)
        ]
    );

    // A bad line in a request stream names the line and field.
    let out = topspin(
        &["call", a, "kv.v1.Store/GetMany"],
        Some("{\"key\": \"y\"}\n{\"key\": 7}\n"),
    );
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("stdin line 2"), "{}", out.stderr);
    assert!(out.stderr.contains("field `key`"), "{}", out.stderr);

    // Server streaming: Watch never ends by itself; read two lines, then stop the process.
    let mut child = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .args([
            "call",
            a,
            "kv.v1.Store/Watch",
            "-d",
            r#"{"includeExisting": true}"#,
        ])
        .args(["--timeout", "20s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = json(&lines.next().unwrap().unwrap());
    let second = json(&lines.next().unwrap().unwrap());
    assert_eq!(first["put"]["key"], "y");
    assert_eq!(second["put"]["key"], "z");
    // A change made now shows up on the open watch.
    ok(
        &["call", a, "kv.v1.Store/Delete", "-d", r#"{"key": "y"}"#],
        None,
    );
    assert_eq!(
        json(&lines.next().unwrap().unwrap()),
        json(r#"{"deleted": "y"}"#)
    );
    // Closing our end of the pipe (like `| head -3`) ends the command quietly at its next
    // write, which the next change causes.
    drop(lines);
    ok(
        &["call", a, "kv.v1.Store/Delete", "-d", r#"{"key": "z"}"#],
        None,
    );
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("topspin watch did not end after its stdout closed")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn proto_files_metadata_and_no_reflection() {
    // A server without reflection whose Get answers with a request header.
    let builder = Server::builder().unary(
        kv::store_descriptor::GET.path,
        ProstCodec::<kv::Entry, kv::GetRequest>::default(),
        |req: Request<kv::GetRequest>| async move {
            let user = req
                .metadata()
                .get_str("x-user")
                .unwrap_or("nobody")
                .to_owned();
            Ok(Response::new(kv::Entry {
                key: req.into_inner().key,
                value: user,
                version: 1,
            }))
        },
    );
    let server = TestServer::start(builder, "tcp://127.0.0.1:0");
    let a = server.address.as_str();
    let (proto, include) = kv_proto();
    let (proto, include) = (proto.to_str().unwrap(), include.to_str().unwrap());

    let out = ok(
        &[
            "call",
            a,
            "kv.v1.Store/Get",
            "--proto",
            proto,
            "-I",
            include,
            "-H",
            "x-user: ann",
            "-d",
            r#"{"key": "k"}"#,
        ],
        None,
    );
    assert_eq!(
        json(&out),
        json(r#"{"key": "k", "value": "ann", "version": "1"}"#)
    );

    // --proto without -I: the file's directory is the import path.
    let out = ok(&["list", "--proto", proto], None);
    assert!(out.starts_with("kv.v1.Store\n"));
    let out = ok(&["describe", "--proto", proto, "kv.v1.Entry"], None);
    assert!(out.contains("message Entry {\n  // The key.\n  string key = 1;\n"));

    // proto2 labels and options survive.
    let legacy = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../topspin-build/compile-tests/proto/edge/proto2.proto");
    let out = ok(
        &[
            "describe",
            "--proto",
            legacy.to_str().unwrap(),
            "edge.legacy.Old",
        ],
        None,
    );
    assert_eq!(
        out,
        "message Old {\n  required string name = 1;\n  optional int32 count = 2 [default = 7];\n  \
         repeated int32 packed = 3 [packed = true];\n  optional bytes blob = 4;\n}\n"
    );

    // Without --proto the missing reflection service is explained.
    let out = topspin(&["list", a], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("does not offer reflection"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--proto"));

    let out = topspin(&["list", "--proto", "/nonexistent/x.proto"], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("could not read /nonexistent/x.proto"),
        "{}",
        out.stderr
    );

    // A broken .proto: the error says where.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.proto");
    std::fs::write(&bad, "syntax = \"proto3\";\nmessage A { strin x = 1; }\n").unwrap();
    let out = topspin(&["list", "--proto", bad.to_str().unwrap()], None);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("bad.proto:2:13: name 'strin' is not defined"),
        "{}",
        out.stderr
    );
}

#[test]
fn unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let path = format!("unix://{}", dir.path().join("kv.sock").display());
    let server = TestServer::start(kvstore::server_builder(kvstore::KvStore::default()), &path);
    let out = ok(&["list", &server.address], None);
    assert!(out.contains("\nkv.v1.Store\n"), "{out}");
    let out = ok(
        &[
            "call",
            &server.address,
            "kv.v1.Store/Put",
            "-d",
            r#"{"key": "u", "value": "1"}"#,
        ],
        None,
    );
    assert_eq!(json(&out), json(r#"{"version": "1"}"#));
}

#[test]
fn describe_without_a_name_describes_every_service() {
    let server = TestServer::kvstore();
    let out = ok(&["describe", &server.address], None);
    assert!(out.contains("service Store {\n"), "{out}");
    assert!(out.contains("service Reflection {\n"), "{out}");
    assert!(
        out.contains("  rpc Apply(stream kv.v1.Mutation) returns (kv.v1.ApplySummary);\n"),
        "{out}"
    );

    // With --proto and no ADDR nor NAME: every service of the files.
    let (proto, _) = kv_proto();
    let out = ok(&["describe", "--proto", proto.to_str().unwrap()], None);
    assert!(out.contains("service Store {\n"), "{out}");
    // With --proto, one argument that is an address (it has a ':') is the server, not a name.
    let out = ok(
        &[
            "describe",
            "--proto",
            proto.to_str().unwrap(),
            &server.address,
        ],
        None,
    );
    assert!(out.contains("service Store {\n"), "{out}");
}

/// A server without reflection whose `kv.v1.Store/Get` answers with the `x-user` header and
/// the hex of the `x-trace-bin` header: `{"value": "ann|0001ff"}`.
fn header_echo() -> TestServer {
    let builder = Server::builder().unary(
        kv::store_descriptor::GET.path,
        ProstCodec::<kv::Entry, kv::GetRequest>::default(),
        |req: Request<kv::GetRequest>| async move {
            let user = req.metadata().get_str("x-user").unwrap_or("nobody");
            let trace: String = req
                .metadata()
                .get("x-trace-bin")
                .unwrap_or_default()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            Ok(Response::new(kv::Entry {
                value: format!("{user}|{trace}"),
                ..Default::default()
            }))
        },
    );
    TestServer::start(builder, "tcp://127.0.0.1:0")
}

#[test]
fn header_keys_are_lower_cased_and_binary_values_are_base64() {
    let server = header_echo();
    let (proto, include) = kv_proto();
    let (proto, include) = (proto.to_str().unwrap(), include.to_str().unwrap());
    let call = |headers: &[&str]| {
        let mut args = vec![
            "call",
            server.address.as_str(),
            "kv.v1.Store/Get",
            "--proto",
            proto,
            "-I",
            include,
        ];
        for h in headers {
            args.extend(["-H", h]);
        }
        topspin(&args, None)
    };
    let out = call(&["X-User: ann", "X-Trace-Bin: AAH/"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(json(&out.stdout), json(r#"{"value": "ann|0001ff"}"#));
    // Every flavour of base64 grpcurl takes: padded or not, standard or URL-safe.
    for value in ["AAE=", "AAE", "_-8", "/+8="] {
        let out = call(&[&format!("x-trace-bin: {value}")]);
        assert_eq!(out.code, 0, "{value}: {}", out.stderr);
        let want = if value.starts_with('A') {
            "nobody|0001"
        } else {
            "nobody|ffef"
        };
        assert_eq!(json(&out.stdout)["value"], want, "{value}");
    }
    let out = call(&["x-trace-bin: not base64!"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("x-trace-bin") && out.stderr.contains("base64"),
        "{}",
        out.stderr
    );
}

#[test]
fn proto_paths_resolve_against_include_dirs() {
    let (_, include) = kv_proto();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .current_dir(dir.path()) // kv/v1/kv.proto is not here: only under -I
        .args(["list", "--proto", "kv/v1/kv.proto", "-I"])
        .arg(&include)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("kv.v1.Store\n"));

    let out = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .current_dir(dir.path())
        .args(["list", "--proto", "kv/v1/nope.proto", "-I"])
        .arg(&include)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kv/v1/nope.proto"), "{stderr}");
}

/// A fake HTTP/2 server (as a gRPC server is): answers every connection with an empty
/// SETTINGS frame, then reads until the client hangs up. Serves `connections` of them.
fn fake_http2_server(connections: usize) -> String {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().take(connections) {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let _ = conn.write_all(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00");
                let _ = conn.set_read_timeout(Some(Duration::from_secs(20)));
                let mut buf = [0u8; 256];
                while matches!(conn.read(&mut buf), Ok(n) if n > 0) {}
            });
        }
    });
    address
}

#[test]
fn an_http2_peer_is_named() {
    let address = fake_http2_server(2);
    let out = topspin(&["list", &address], None);
    assert_eq!(out.code, 64 + 14, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "the server at {address} speaks HTTP/2 (gRPC?), not topspin"
        )),
        "{}",
        out.stderr
    );
    let out = topspin(&["health", &address], None);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stderr.contains("speaks HTTP/2 (gRPC?)"),
        "{}",
        out.stderr
    );
}

#[test]
fn health_of_the_kvstore_server() {
    let server = TestServer::kvstore();
    let a = server.address.as_str();
    let out = topspin(&["health", a], None);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "SERVING\n"),
        "{}",
        out.stderr
    );
    let out = topspin(&["health", a, "kv.v1.Store"], None);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "SERVING\n"),
        "{}",
        out.stderr
    );
    let out = ok(&["call", a, "grpc.health.v1.Health/Check"], None);
    assert_eq!(json(&out), json(r#"{"status": "SERVING"}"#));
    let out = topspin(&["health", a, "no.such.Service"], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("no.such.Service"), "{}", out.stderr);

    // A server without the health service.
    let plain = header_echo();
    let out = topspin(&["health", &plain.address], None);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("health checking"), "{}", out.stderr);

    // Nobody listens there.
    let out = topspin(&["health", "tcp://127.0.0.1:1"], None);
    assert_eq!(out.code, 3, "{}", out.stderr);

    // --watch: SERVING, then NOT_SERVING when the server begins a graceful shutdown, which
    // ends the watch; the exit code is the last status's.
    let mut child = Command::new(env!("CARGO_BIN_EXE_topspin"))
        .args(["health", a, "kv.v1.Store", "--watch", "--timeout", "30s"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "SERVING");
    server
        .runtime
        .block_on(server.shutdown.shutdown(Duration::from_secs(10)));
    assert_eq!(lines.next().unwrap().unwrap(), "NOT_SERVING");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("topspin health --watch did not end with the server")
        .unwrap();
    assert_eq!(status.code(), Some(1));
}
