//! The Rust client of the cross-language matrix (`testdata/matrix/README.md`).
//!
//! Usage: `matrix-client [--ca FILE] --target ADDR` (`tcp://`, `unix://`, `ws://`, and `tls://`,
//! `wss://` trusting the CA certificates of FILE, PEM, instead of the webpki roots). Runs the ten checks in
//! order, one line each (`ok NAME` / `FAIL NAME: why`), and exits 0 when all passed, 1
//! otherwise. Every check has its own deadline, so the run ends within 60 s.
//!
//! Cancellation in Rust's API is dropping the call's future: the caller sees no `CANCELLED`
//! status (there is nothing left to return it to); the `cancel` check passes when the drop
//! returned and the server saw the call cancelled.

use bytes::Bytes;
use clap::Parser;
use futures_util::stream;
use matrix::pb;
use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};
use topspin::{Code, Compression, Encoding, Endpoint, Metadata, Request, Status};

#[derive(Parser, Debug)]
#[command(about = "The Rust client of the cross-language matrix (testdata/matrix)")]
struct Args {
    /// The server: tcp://HOST:PORT, unix:///PATH, ws://HOST:PORT/PATH, tls://HOST:PORT or
    /// wss://HOST:PORT/PATH.
    #[arg(long, value_name = "ADDR")]
    target: String,
    /// The CA certificates (PEM) a tls:// or wss:// server's certificate must chain to.
    #[arg(long, value_name = "FILE")]
    ca: Option<String>,
}

/// A check's deadline unless it says otherwise.
const CHECK: Duration = Duration::from_secs(5);
/// Each call's own timeout (the server sees it as the deadline).
const CALL: Duration = Duration::from_secs(5);

type Outcome = Result<(), String>;

/// The client under test and the tags of this run.
struct Ctx {
    client: pb::MatrixClient,
    pid: u32,
}

impl Ctx {
    fn tag(&self, check: &str) -> String {
        format!("rust-{}-{check}", self.pid)
    }

    fn req<T>(&self, message: T) -> Request<T> {
        Request::new(message).with_timeout(CALL)
    }

    /// Polls `WasCancelled(tag)` every 50 ms for up to 3 s.
    async fn wait_cancelled(&self, tag: &str) -> Outcome {
        let until = Instant::now() + Duration::from_secs(3);
        loop {
            let flag = self
                .client
                .was_cancelled(self.req(pb::Tag { tag: tag.into() }))
                .await
                .map_err(|s| format!("WasCancelled: {}", show(&s)))?;
            if flag.into_inner().value {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!("the server did not see {tag} cancelled within 3 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn show(s: &Status) -> String {
    format!("{} {:?}", s.code().name(), s.message())
}

fn expect(cond: bool, why: impl FnOnce() -> String) -> Outcome {
    if cond {
        Ok(())
    } else {
        Err(why())
    }
}

fn msg(payload: impl Into<Bytes>) -> pb::Msg {
    pb::Msg {
        payload: payload.into(),
    }
}

fn describe(bytes: &[u8]) -> String {
    if bytes.len() <= 16 {
        format!("{bytes:02x?}")
    } else {
        format!("{} bytes", bytes.len())
    }
}

async fn unary(cx: &Ctx) -> Outcome {
    let md = Metadata::builder()
        .text("x-echo", "v1")
        .and_then(|b| b.binary("x-echo-bin", &[0x00, 0x01, 0xff]))
        .map_err(|e| format!("metadata: {e}"))?
        .build();
    let reply = cx
        .client
        .unary(cx.req(msg("hello")).with_metadata(md))
        .await
        .map_err(|s| show(&s))?;
    let got = |md: &Metadata, k: &str| md.get(k).map(<[u8]>::to_vec);
    let (headers, trailers) = (reply.metadata().clone(), reply.trailers().clone());
    let payload = reply.into_inner().payload;
    expect(payload.as_ref() == b"hello", || {
        format!("payload {:?}", String::from_utf8_lossy(&payload))
    })?;
    let echo = got(&headers, "x-echo");
    expect(echo.as_deref() == Some(b"v1"), || {
        format!("header x-echo = {echo:?}")
    })?;
    let bin = got(&headers, "x-echo-bin");
    expect(bin.as_deref() == Some(&[0x00, 0x01, 0xff][..]), || {
        format!("header x-echo-bin = {bin:02x?}")
    })?;
    let t = got(&trailers, "x-echo-t");
    expect(t.as_deref() == Some(b"v1"), || {
        format!("trailer x-echo-t = {t:?} (headers {headers:?}, trailers {trailers:?})")
    })
}

async fn large(cx: &Ctx) -> Outcome {
    let sent: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    let reply = cx
        .client
        .unary(cx.req(msg(sent.clone())))
        .await
        .map_err(|s| show(&s))?;
    let got = reply.into_inner().payload;
    expect(got.as_ref() == sent.as_slice(), || {
        let at = got.iter().zip(&sent).position(|(a, b)| a != b);
        format!("{} bytes back, first difference at {at:?}", got.len())
    })
}

async fn server_stream(cx: &Ctx) -> Outcome {
    let r = pb::StreamReq {
        count: 5,
        size: 10,
        ..Default::default()
    };
    let mut s = cx
        .client
        .server_stream(cx.req(r))
        .await
        .map_err(|s| show(&s))?
        .into_inner();
    let mut n = 0;
    while let Some(m) = s
        .message()
        .await
        .map_err(|e| format!("after {n} messages: {}", show(&e)))?
    {
        expect(m.payload.as_ref() == b"aaaaaaaaaa", || {
            format!("message {n}: {}", describe(&m.payload))
        })?;
        n += 1;
    }
    expect(n == 5, || format!("{n} messages, not 5"))
}

async fn quiet_stream(cx: &Ctx) -> Outcome {
    let tag = cx.tag("quiet-stream");
    let r = pb::StreamReq {
        hold: true,
        tag: tag.clone(),
        ..Default::default()
    };
    // The call must come back although the server sends nothing.
    let call = tokio::time::timeout(Duration::from_secs(2), cx.client.server_stream(cx.req(r)));
    let mut stream = match call.await {
        Err(_) => {
            return Err("the call was not handed back within 2 s (waits for a message?)".into())
        }
        Ok(r) => r.map_err(|s| show(&s))?.into_inner(),
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Cancelled through the handle the caller keeps: it then reports CANCELLED.
    stream.cancel();
    match stream.message().await {
        Err(s) if s.code() == topspin::Code::Cancelled => {}
        other => return Err(format!("after cancel(): {other:?}, not CANCELLED")),
    }
    cx.wait_cancelled(&tag).await
}

async fn client_stream(cx: &Ctx) -> Outcome {
    let messages = [msg(&b"a"[..]), msg(&b"bb"[..]), msg(&b"ccc"[..])];
    let reply = cx
        .client
        .client_stream(cx.req(stream::iter(messages)))
        .await
        .map_err(|s| show(&s))?
        .into_inner();
    expect(reply.count == 3 && reply.bytes == 6, || {
        format!("Summary(count {}, bytes {})", reply.count, reply.bytes)
    })
}

async fn bidi_open_then_send(cx: &Ctx) -> Outcome {
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::Msg>(4);
    let requests = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    // The call handle, before anything was sent.
    let open = tokio::time::timeout(Duration::from_secs(2), cx.client.bidi(cx.req(requests)));
    let mut replies = match open.await {
        Err(_) => return Err("the call was not handed back before sending (deadlock)".into()),
        Ok(r) => r.map_err(|s| format!("open: {}", show(&s)))?.into_inner(),
    };
    for m in ["a", "b"] {
        tx.send(msg(m))
            .await
            .map_err(|_| format!("send {m}: the request stream is closed"))?;
        let got = replies
            .message()
            .await
            .map_err(|s| format!("receive {m}: {}", show(&s)))?;
        match got {
            Some(g) if g.payload.as_ref() == m.as_bytes() => {}
            Some(g) => return Err(format!("sent {m}, received {}", describe(&g.payload))),
            None => return Err(format!("sent {m}, the stream ended")),
        }
    }
    drop(tx);
    match replies.message().await {
        Ok(None) => Ok(()),
        Ok(Some(g)) => Err(format!("after the end: {}", describe(&g.payload))),
        Err(s) => Err(format!("end: {}", show(&s))),
    }
}

async fn deadline(cx: &Ctx) -> Outcome {
    let tag = cx.tag("deadline");
    let r = pb::SleepReq {
        millis: 2000,
        tag: tag.clone(),
    };
    let t0 = Instant::now();
    let reply = cx
        .client
        .sleep(Request::new(r).with_timeout(Duration::from_millis(200)))
        .await;
    let took = t0.elapsed();
    match reply {
        Ok(_) => return Err(format!("answered after {took:?}, no DEADLINE_EXCEEDED")),
        Err(s) if s.code() != Code::DeadlineExceeded => {
            return Err(format!("{} after {took:?}", show(&s)))
        }
        Err(_) => {}
    }
    expect(took <= Duration::from_millis(1500), || {
        format!("DEADLINE_EXCEEDED only after {took:?}")
    })?;
    cx.wait_cancelled(&tag).await
}

async fn cancel(cx: &Ctx) -> Outcome {
    let tag = cx.tag("cancel");
    let r = pb::SleepReq {
        millis: 10_000,
        tag: tag.clone(),
    };
    // Rust cancels a call by dropping its future: the timeout drops it after 200 ms.
    let call = cx
        .client
        .sleep(Request::new(r).with_timeout(Duration::from_secs(30)));
    if let Ok(r) = tokio::time::timeout(Duration::from_millis(200), call).await {
        return Err(match r {
            Ok(_) => "Sleep(10000) answered within 200 ms".into(),
            Err(s) => format!("Sleep(10000) ended within 200 ms: {}", show(&s)),
        });
    }
    eprintln!(
        "note cancel: Rust cancels a call by dropping it; the caller sees no CANCELLED status \
         (the dropped call has no result), the server does (WasCancelled)"
    );
    cx.wait_cancelled(&tag).await
}

async fn error_details(cx: &Ctx) -> Outcome {
    let details: &[u8] = &[0x08, 0x05, 0x12, 0x04, 0x6e, 0x6f, 0x70, 0x65];
    let r = pb::FailReq {
        code: 5,
        message: "nope".into(),
        details: Bytes::from_static(details),
    };
    let s = match cx.client.fail(cx.req(r)).await {
        Ok(_) => return Err("Fail answered OK".into()),
        Err(s) => s,
    };
    expect(s.code() == Code::NotFound, || format!("code {}", show(&s)))?;
    expect(s.message() == "nope", || {
        format!("message {:?}", s.message())
    })?;
    expect(s.details().as_ref() == details, || {
        format!("details {:02x?}", s.details().as_ref())
    })?;
    // The handler's response header travels before the error and stays with it (§5.4).
    expect(s.headers().get_str("x-fail-h") == Some("v1"), || {
        format!(
            "header x-fail-h {:?} (headers {:?}, trailers {:?})",
            s.headers().get_str("x-fail-h"),
            s.headers(),
            s.metadata()
        )
    })
}

async fn compression(cx: &Ctx) -> Outcome {
    let sent = Bytes::from(vec![b'a'; 64 * 1024]);
    for encoding in [Encoding::Gzip, Encoding::Zstd] {
        let c = Compression::new(encoding);
        let reply = cx
            .client
            .unary(cx.req(msg(sent.clone())).with_compression(Some(c)))
            .await
            .map_err(|s| format!("{}: {}", encoding.name(), show(&s)))?;
        let got = reply.into_inner().payload;
        expect(got == sent, || {
            format!("{}: {} different bytes back", encoding.name(), got.len())
        })?;
    }
    Ok(())
}

/// A root span of the client's own; the call inside it goes through topspin's OpenTelemetry
/// instrumentation, which sends the trace context; the server answers with the trace id it saw.
async fn trace(cx: &Ctx) -> Outcome {
    use tracing::Instrument;
    let root = tracing::info_span!("matrix trace check");
    let want = matrix::trace_id(&root).ok_or("the root span has no OpenTelemetry context")?;
    let reply = cx
        .client
        .unary(cx.req(msg(Bytes::from_static(b"trace"))))
        .instrument(root)
        .await
        .map_err(|s| show(&s))?;
    let got = reply.metadata().get_str("x-trace-id").map(str::to_owned);
    expect(got.as_deref() == Some(want.as_str()), || {
        format!("x-trace-id {got:?}, the root span's trace {want}")
    })
}

/// Runs one check under its deadline and prints its line.
async fn run<'a, F>(name: &str, budget: Duration, check: F) -> bool
where
    F: Future<Output = Outcome> + 'a,
{
    let line = match tokio::time::timeout(budget, check).await {
        Ok(Ok(())) => format!("ok {name}"),
        Ok(Err(why)) => format!("FAIL {name}: {why}"),
        Err(_) => format!("FAIL {name}: no result within its {budget:?} deadline"),
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    line.starts_with("ok ")
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    matrix::install_tracing();
    let endpoint = Endpoint::new(args.target.as_str()).map(|e| match &args.ca {
        None => e,
        Some(ca) => match topspin::tls::ClientTls::ca_pem_file(ca) {
            Ok(tls) => e.tls(tls),
            Err(err) => {
                eprintln!("matrix-client: --ca {ca}: {err}");
                std::process::exit(2);
            }
        },
    });
    let client = match endpoint {
        Ok(e) => pb::MatrixClient::new(e.connect_lazy()),
        Err(e) => {
            eprintln!("matrix-client: bad target {}: {e}", args.target);
            std::process::exit(2);
        }
    };
    let cx = Ctx {
        client,
        pid: std::process::id(),
    };
    let mut all = true;
    all &= run("unary", CHECK, unary(&cx)).await;
    all &= run("large", CHECK, large(&cx)).await;
    all &= run("server-stream", CHECK, server_stream(&cx)).await;
    all &= run("quiet-stream", CHECK, quiet_stream(&cx)).await;
    all &= run("client-stream", CHECK, client_stream(&cx)).await;
    all &= run("bidi-open-then-send", CHECK, bidi_open_then_send(&cx)).await;
    all &= run("deadline", CHECK, deadline(&cx)).await;
    all &= run("cancel", CHECK, cancel(&cx)).await;
    all &= run("error-details", CHECK, error_details(&cx)).await;
    all &= run("compression", CHECK, compression(&cx)).await;
    all &= run("trace", CHECK, trace(&cx)).await;
    std::process::exit(if all { 0 } else { 1 });
}
