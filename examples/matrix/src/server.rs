//! The `Matrix` service as `matrix.proto` describes it.

use crate::pb;
use futures_util::stream::{self, BoxStream, StreamExt};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use topspin::{Code, Metadata, Request, Response, Status, Streaming};

/// The service's state: the tags of the calls seen cancelled (or past their deadline). Cheap to
/// clone; clones share it, so every listener of one process answers `WasCancelled` alike.
#[derive(Clone, Debug, Default)]
pub struct State {
    cancelled: Arc<Mutex<HashSet<String>>>,
}

impl State {
    fn mark(&self, tag: &str) {
        let mut set = self.cancelled.lock().unwrap_or_else(|e| e.into_inner());
        set.insert(tag.to_owned());
    }

    fn was_cancelled(&self, tag: &str) -> bool {
        let set = self.cancelled.lock().unwrap_or_else(|e| e.into_inner());
        set.contains(tag)
    }
}

/// Records its tag as cancelled when dropped while armed: a handler's future (or a response
/// stream) is dropped when its call is cancelled, by the client or by the deadline.
struct MarkOnDrop {
    state: State,
    tag: String,
    armed: bool,
}

impl MarkOnDrop {
    fn new(state: &State, tag: String) -> MarkOnDrop {
        MarkOnDrop {
            state: state.clone(),
            tag,
            armed: true,
        }
    }

    /// The call ended normally: nothing to record.
    fn disarm(mut self) {
        self.armed = false;
    }

    fn fire(mut self) {
        self.state.mark(&self.tag);
        self.armed = false;
    }
}

impl Drop for MarkOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.state.mark(&self.tag);
        }
    }
}

/// Completes when the call is cancelled (never if the request carries no cancellation).
async fn cancelled<T>(req: &Request<T>) {
    match req.cancellation() {
        Some(c) => c.cancelled().await,
        None => std::future::pending().await,
    }
}

fn metadata_error(e: impl std::fmt::Display) -> Status {
    Status::internal(format!("metadata: {e}"))
}

/// The next message of a request stream as a response item, or the end.
async fn next_echo(
    mut requests: Streaming<pb::Msg>,
) -> Option<(Result<pb::Msg, Status>, Option<Streaming<pb::Msg>>)> {
    match requests.message().await {
        Ok(Some(m)) => Some((Ok(m), Some(requests))),
        Ok(None) => None,
        Err(e) => Some((Err(e), None)),
    }
}

impl pb::Matrix for State {
    async fn unary(&self, req: Request<pb::Msg>) -> Result<Response<pb::Msg>, Status> {
        let (mut headers, mut trailers) = (Metadata::builder(), Metadata::builder());
        if let Some(v) = req.metadata().get("x-echo") {
            headers = headers.entry("x-echo", v).map_err(metadata_error)?;
            trailers = trailers.entry("x-echo-t", v).map_err(metadata_error)?;
        }
        if let Some(v) = req.metadata().get("x-echo-bin") {
            headers = headers.entry("x-echo-bin", v).map_err(metadata_error)?;
        }
        // The trace the call's span belongs to: the client's, when it sent `traceparent`.
        if let Some(id) = crate::trace_id(&tracing::Span::current()) {
            headers = headers.text("x-trace-id", &id).map_err(metadata_error)?;
        }
        Ok(Response::new(req.into_inner())
            .with_metadata(headers.build())
            .with_trailers(trailers.build()))
    }

    type ServerStreamStream = BoxStream<'static, Result<pb::Msg, Status>>;

    async fn server_stream(
        &self,
        req: Request<pb::StreamReq>,
    ) -> Result<Response<Self::ServerStreamStream>, Status> {
        let cancellation = req.cancellation();
        let r = req.into_inner();
        if r.hold {
            // A quiet stream: nothing until the call is cancelled, which is recorded.
            let guard = MarkOnDrop::new(self, r.tag);
            let quiet = stream::once(async move {
                match cancellation {
                    Some(c) => c.cancelled().await,
                    None => std::future::pending().await,
                }
                guard.fire();
                Err(Status::cancelled("cancelled"))
            });
            return Ok(Response::new(quiet.boxed()));
        }
        let payload = bytes::Bytes::from(vec![b'a'; r.size as usize]);
        let messages = (0..r.count).map(move |_| {
            Ok(pb::Msg {
                payload: payload.clone(),
            })
        });
        Ok(Response::new(stream::iter(messages).boxed()))
    }

    async fn client_stream(
        &self,
        req: Request<Streaming<pb::Msg>>,
    ) -> Result<Response<pb::Summary>, Status> {
        let mut requests = req.into_inner();
        let mut summary = pb::Summary::default();
        while let Some(m) = requests.message().await? {
            summary.count += 1;
            summary.bytes += m.payload.len() as u64;
        }
        Ok(Response::new(summary))
    }

    type BidiStream = BoxStream<'static, Result<pb::Msg, Status>>;

    async fn bidi(
        &self,
        req: Request<Streaming<pb::Msg>>,
    ) -> Result<Response<Self::BidiStream>, Status> {
        let mut requests = req.into_inner();
        // Nothing goes out, headers included, before the first request message: the handler
        // answers only once it has one (or the client ended its stream without any).
        let first = match requests.message().await? {
            Some(m) => m,
            None => return Ok(Response::new(stream::empty().boxed())),
        };
        let rest = stream::unfold(Some(requests), |s| async move { next_echo(s?).await });
        Ok(Response::new(
            stream::once(async move { Ok(first) }).chain(rest).boxed(),
        ))
    }

    async fn fail(&self, req: Request<pb::FailReq>) -> Result<Response<pb::Msg>, Status> {
        let r = req.into_inner();
        let code = u16::try_from(r.code).map_or(Code::Unknown, Code::from_u16);
        // A response header that goes out before the error (protocol.md §5.4): a Rust handler
        // attaches a failing call's headers to its status.
        let headers = Metadata::builder()
            .text("x-fail-h", "v1")
            .map_err(metadata_error)?
            .build();
        Err(Status::new(code, r.message)
            .with_details(r.details)
            .with_headers(headers))
    }

    async fn sleep(&self, req: Request<pb::SleepReq>) -> Result<Response<pb::Msg>, Status> {
        let guard = MarkOnDrop::new(self, req.get_ref().tag.clone());
        let millis = u64::from(req.get_ref().millis);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(millis)) => {
                guard.disarm();
                Ok(Response::new(pb::Msg::default()))
            }
            _ = cancelled(&req) => {
                guard.fire();
                Err(Status::cancelled("cancelled"))
            }
        }
    }

    async fn was_cancelled(&self, req: Request<pb::Tag>) -> Result<Response<pb::Flag>, Status> {
        let value = self.was_cancelled(&req.get_ref().tag);
        Ok(Response::new(pb::Flag { value }))
    }
}
