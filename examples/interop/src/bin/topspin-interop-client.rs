//! gRPC's interop test cases, run by topspin's `grpc://` client against any interop server
//! (`scripts/test-interop.sh` runs them against grpc-go's): the cases that need no cloud
//! credentials, compression checks by the server or cancellation of a call with no handle.
//!
//! Usage: `topspin-interop-client --server_port=N [--server_host=H] [--test_case=NAME|all]`.
//! Exits 0 when the case (or every case) passed; prints what failed otherwise.

use futures_util::stream;
use std::time::Duration;
use topspin::{Code, Metadata, Request, Status, Streaming};
use topspin_interop::testing as pb;
use topspin_interop::{ECHO_INITIAL, ECHO_TRAILING};

/// Every case this client runs, in order.
const CASES: &[&str] = &[
    "empty_unary",
    "large_unary",
    "client_streaming",
    "server_streaming",
    "ping_pong",
    "empty_stream",
    "timeout_on_sleeping_server",
    "cancel_after_first_response",
    "status_code_and_message",
    "special_status_message",
    "custom_metadata",
    "unimplemented_method",
    "unimplemented_service",
];

const REQ_SIZES: [i32; 4] = [27182, 8, 1828, 45904];
const RESP_SIZES: [i32; 4] = [31415, 9, 2653, 58979];

type Outcome = Result<(), String>;

fn check(ok: bool, what: impl FnOnce() -> String) -> Outcome {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn zeros(size: i32) -> Option<pb::Payload> {
    Some(pb::Payload {
        r#type: 0,
        body: vec![0; size as usize].into(),
    })
}

fn size_of(p: &Option<pb::Payload>) -> usize {
    p.as_ref().map_or(0, |p| p.body.len())
}

fn output(resp: i32, req: i32) -> pb::StreamingOutputCallRequest {
    pb::StreamingOutputCallRequest {
        response_parameters: vec![pb::ResponseParameters {
            size: resp,
            ..Default::default()
        }],
        payload: zeros(req),
        ..Default::default()
    }
}

/// Reads a response stream to its end: the sizes of its payloads, or its error status.
async fn sizes(s: &mut Streaming<pb::StreamingOutputCallResponse>) -> Result<Vec<usize>, Status> {
    let mut out = Vec::new();
    while let Some(m) = s.message().await? {
        out.push(size_of(&m.payload));
    }
    Ok(out)
}

struct Cases {
    client: pb::TestServiceClient,
    other: pb::UnimplementedServiceClient,
}

impl Cases {
    async fn run(&self, case: &str) -> Outcome {
        match case {
            "empty_unary" => self.empty_unary().await,
            "large_unary" => self.large_unary().await,
            "client_streaming" => self.client_streaming().await,
            "server_streaming" => self.server_streaming().await,
            "ping_pong" => self.ping_pong().await,
            "empty_stream" => self.empty_stream().await,
            "timeout_on_sleeping_server" => self.timeout_on_sleeping_server().await,
            "cancel_after_first_response" => self.cancel_after_first_response().await,
            "status_code_and_message" => self.status("test status message").await,
            "special_status_message" => {
                self.status("\t\ntest with whitespace\r\nand Unicode BMP ☺ and non-BMP 😈\t\n")
                    .await
            }
            "custom_metadata" => self.custom_metadata().await,
            "unimplemented_method" => self.unimplemented_method().await,
            "unimplemented_service" => self.unimplemented_service().await,
            other => Err(format!("no test case {other:?}")),
        }
    }

    async fn empty_unary(&self) -> Outcome {
        let r = self
            .client
            .empty_call(pb::Empty {})
            .await
            .map_err(|e| e.to_string())?;
        check(*r.get_ref() == pb::Empty {}, || format!("{r:?}"))
    }

    async fn large_unary(&self) -> Outcome {
        let req = pb::SimpleRequest {
            response_size: 314159,
            payload: zeros(271828),
            ..Default::default()
        };
        let r = self
            .client
            .unary_call(req)
            .await
            .map_err(|e| e.to_string())?;
        let n = size_of(&r.get_ref().payload);
        check(n == 314159, || format!("a payload of {n} bytes"))
    }

    async fn client_streaming(&self) -> Outcome {
        let reqs = REQ_SIZES.map(|s| pb::StreamingInputCallRequest {
            payload: zeros(s),
            ..Default::default()
        });
        let r = self
            .client
            .streaming_input_call(stream::iter(reqs))
            .await
            .map_err(|e| e.to_string())?;
        let n = r.get_ref().aggregated_payload_size;
        check(n == 74922, || format!("aggregated {n}"))
    }

    async fn server_streaming(&self) -> Outcome {
        let req = pb::StreamingOutputCallRequest {
            response_parameters: RESP_SIZES
                .iter()
                .map(|&size| pb::ResponseParameters {
                    size,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let mut s = self
            .client
            .streaming_output_call(req)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let got = sizes(&mut s).await.map_err(|e| e.to_string())?;
        let want: Vec<usize> = RESP_SIZES.iter().map(|&s| s as usize).collect();
        check(got == want, || format!("sizes {got:?}"))
    }

    async fn ping_pong(&self) -> Outcome {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let requests = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        let mut replies = self
            .client
            .full_duplex_call(requests)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        for (req, resp) in REQ_SIZES.iter().zip(RESP_SIZES) {
            tx.send(output(resp, *req))
                .await
                .map_err(|_| "the call ended early")?;
            let m = replies.message().await.map_err(|e| e.to_string())?;
            let n = m.as_ref().map(|m| size_of(&m.payload));
            check(n == Some(resp as usize), || {
                format!("reply {n:?}, want {resp}")
            })?;
        }
        drop(tx);
        let rest = sizes(&mut replies).await.map_err(|e| e.to_string())?;
        check(rest.is_empty(), || format!("more replies: {rest:?}"))
    }

    async fn empty_stream(&self) -> Outcome {
        let mut replies = self
            .client
            .full_duplex_call(stream::empty())
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let got = sizes(&mut replies).await.map_err(|e| e.to_string())?;
        check(got.is_empty(), || format!("replies {got:?}"))
    }

    async fn timeout_on_sleeping_server(&self) -> Outcome {
        let req = Request::new(stream::iter([output(31415, 27182)]).chain(stream::pending()))
            .with_timeout(Duration::from_millis(1));
        use futures_util::StreamExt;
        let r = match self.client.full_duplex_call(req).await {
            Ok(r) => sizes(&mut r.into_inner()).await.map(|_| ()),
            Err(e) => Err(e),
        };
        match r {
            Err(e) if e.code() == Code::DeadlineExceeded => Ok(()),
            other => Err(format!("{other:?}, want DEADLINE_EXCEEDED")),
        }
    }

    async fn cancel_after_first_response(&self) -> Outcome {
        use futures_util::StreamExt;
        let requests = stream::iter([output(31415, 27182)]).chain(stream::pending());
        let mut replies = self
            .client
            .full_duplex_call(requests)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let first = replies.message().await.map_err(|e| e.to_string())?;
        check(first.is_some(), || "no first reply".into())?;
        replies.cancel();
        match replies.message().await {
            Err(e) if e.code() == Code::Cancelled => Ok(()),
            other => Err(format!("{other:?}, want CANCELLED")),
        }
    }

    async fn status(&self, message: &str) -> Outcome {
        let echo = Some(pb::EchoStatus {
            code: 2,
            message: message.into(),
        });
        let req = pb::SimpleRequest {
            response_status: echo.clone(),
            ..Default::default()
        };
        let e = self.client.unary_call(req).await.err();
        check(
            e.as_ref()
                .is_some_and(|e| e.code() == Code::Unknown && e.message() == message),
            || format!("unary: {e:?}"),
        )?;
        let req = pb::StreamingOutputCallRequest {
            response_status: echo,
            ..Default::default()
        };
        let mut replies = self
            .client
            .full_duplex_call(stream::iter([req]))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let e = sizes(&mut replies).await.err();
        check(
            e.as_ref()
                .is_some_and(|e| e.code() == Code::Unknown && e.message() == message),
            || format!("full duplex: {e:?}"),
        )
    }

    async fn custom_metadata(&self) -> Outcome {
        let md = || {
            Metadata::builder()
                .text(ECHO_INITIAL, "test_initial_metadata_value")
                .and_then(|b| b.binary(ECHO_TRAILING, &[0xab, 0xab, 0xab]))
                .map(|b| b.build())
                .map_err(|e| e.to_string())
        };
        let echoed = |h: &Metadata, t: &Metadata| {
            check(
                h.get_str(ECHO_INITIAL) == Some("test_initial_metadata_value")
                    && t.get(ECHO_TRAILING) == Some(&[0xab, 0xab, 0xab][..]),
                || format!("headers {h:?}, trailers {t:?}"),
            )
        };
        let req = pb::SimpleRequest {
            response_size: 1,
            payload: zeros(1),
            ..Default::default()
        };
        let r = self
            .client
            .unary_call(Request::new(req).with_metadata(md()?))
            .await
            .map_err(|e| e.to_string())?;
        echoed(r.metadata(), r.trailers())?;
        let req = Request::new(stream::iter([output(1, 1)])).with_metadata(md()?);
        let mut replies = self
            .client
            .full_duplex_call(req)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let headers = replies.headers().await.map_err(|e| e.to_string())?.clone();
        sizes(&mut replies).await.map_err(|e| e.to_string())?;
        let trailers = replies.trailers().cloned().unwrap_or_default();
        echoed(&headers, &trailers)
    }

    async fn unimplemented_method(&self) -> Outcome {
        let e = self.client.unimplemented_call(pb::Empty {}).await.err();
        check(
            e.as_ref().is_some_and(|e| e.code() == Code::Unimplemented),
            || format!("{e:?}"),
        )
    }

    async fn unimplemented_service(&self) -> Outcome {
        let e = self.other.unimplemented_call(pb::Empty {}).await.err();
        check(
            e.as_ref().is_some_and(|e| e.code() == Code::Unimplemented),
            || format!("{e:?}"),
        )
    }
}

fn arg(name: &str) -> Option<String> {
    let prefix = format!("--{name}=");
    std::env::args()
        .skip(1)
        .find_map(|a| a.strip_prefix(&prefix).map(str::to_owned))
}

#[tokio::main]
async fn main() {
    let host = arg("server_host").unwrap_or_else(|| "127.0.0.1".into());
    let Some(port) = arg("server_port") else {
        eprintln!("usage: topspin-interop-client --server_port=N [--server_host=H] [--test_case=NAME|all]");
        std::process::exit(2);
    };
    let case = arg("test_case").unwrap_or_else(|| "all".into());
    let address = format!("grpc://{host}:{port}");
    let channel = match topspin::Channel::connect(address.as_str()).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("topspin-interop-client: {address}: {e}");
            std::process::exit(1);
        }
    };
    let cases = Cases {
        client: pb::TestServiceClient::new(channel.clone()),
        other: pb::UnimplementedServiceClient::from(channel),
    };
    let names: Vec<&str> = if case == "all" {
        CASES.to_vec()
    } else {
        vec![case.as_str()]
    };
    let mut failed = 0;
    for name in names {
        match tokio::time::timeout(Duration::from_secs(60), cases.run(name)).await {
            Ok(Ok(())) => println!("interop {name}: ok"),
            Ok(Err(why)) => {
                failed += 1;
                eprintln!("interop {name}: FAILED: {why}");
            }
            Err(_) => {
                failed += 1;
                eprintln!("interop {name}: FAILED: no answer in 60 s");
            }
        }
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
