//! The call core's rules, without a face: a recording [`Respond`] stands for the native engine
//! and an h2 stream.

use super::*;
use crate::server::handler::{CallKind, Handler};
use std::sync::Arc;
use std::time::Duration;

/// What a face was asked to do, in order.
#[derive(Debug, PartialEq)]
enum Did {
    Headers(usize),
    Reply(usize),
    Send(usize, bool),
    Credit(u32),
    End(Code, usize),
}

/// A face that records its steps; `room: false` keeps replies as a face without send
/// capacity does; `refuse` fails its headers as a stream that is gone does.
#[derive(Default)]
struct Face {
    did: Vec<Did>,
    full: bool,
    refuse: bool,
}

impl Respond for Face {
    fn headers(&mut self, headers: Metadata) -> Result<(), Status> {
        if self.refuse {
            return Err(Status::cancelled("gone"));
        }
        self.did.push(Did::Headers(headers.len()));
        Ok(())
    }
    fn reply(&mut self, message: Payload, trailers: Metadata) -> Result<Option<Metadata>, Status> {
        self.did.push(Did::Reply(message.len()));
        Ok((!self.full).then_some(trailers))
    }
    fn send(&mut self, message: Payload, compress: bool, _ack: Ack) {
        self.did.push(Did::Send(message.len(), compress));
    }
    fn credit(&mut self, bytes: u32) {
        self.did.push(Did::Credit(bytes));
    }
    fn end(&mut self, status: Status, trailers: Metadata) {
        self.did.push(Did::End(status.code(), trailers.len()));
    }
}

fn md(n: usize) -> Metadata {
    (0..n)
        .try_fold(Metadata::builder(), |b, i| b.entry(&format!("k{i}"), b"v"))
        .expect("metadata")
        .build()
}

fn payload(n: usize) -> Payload {
    Payload::from(Bytes::from(vec![1u8; n]))
}

fn ctx(method: &str, deadline: Option<Instant>) -> ServerContext {
    ServerContext {
        deadline,
        encoding: None,
        compressed: false,
        method: method.into(),
        cancel: Default::default(),
        conn: crate::test_util::conn_context(),
    }
}

/// A handler whose future answers at once with `Outcome::Finished(Ok)`, or never.
struct Fixed {
    ready: bool,
}

impl Handler for Fixed {
    fn kind(&self) -> CallKind {
        CallKind::Unary
    }
    fn codec(&self) -> u8 {
        1
    }
    fn call(
        &self,
        _: Input,
        _: Metadata,
        _: ServerContext,
        _: IoRef<'_>,
        recycled: Option<BoxFut>,
    ) -> BoxFut {
        if self.ready {
            super::super::handler::place(
                recycled,
                std::future::ready(Outcome::Finished(Ok(Metadata::new()))),
            )
        } else {
            super::super::handler::place(recycled, std::future::pending())
        }
    }
}

fn waiting(method: &str) -> Waiting {
    let handler: HandlerRef = Arc::new(Fixed { ready: true });
    Waiting::new(handler, Metadata::new(), ctx(method, None), None)
}

#[test]
fn a_unary_call_takes_exactly_one_request_message() {
    let mut w = waiting("/s/One");
    w.on_message(Bytes::from_static(b"a"), false)
        .expect("the first");
    let st = w
        .on_message(Bytes::from_static(b"b"), false)
        .expect_err("a second");
    assert_eq!(st.code(), Code::InvalidArgument);
    assert_eq!(st.message(), "/s/One takes one request message, got more");
    let (_, m) = w.on_half_closed().expect("one came");
    assert_eq!(&m[..], b"a");

    let st = waiting("/s/None")
        .on_half_closed()
        .err()
        .expect("none came");
    assert_eq!(st.code(), Code::InvalidArgument);
    assert_eq!(st.message(), "/s/None takes one request message, got none");
}

#[test]
fn an_unknown_method_is_unimplemented() {
    let registry = Registry::default();
    let st = lookup(&registry, "/s/Missing").err().expect("refused");
    assert_eq!(st.code(), Code::Unimplemented);
    assert_eq!(
        st.message(),
        "method /s/Missing is not implemented by this server"
    );
}

#[test]
fn a_call_whose_deadline_passed_on_its_way_in_is_not_started() {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let handler: HandlerRef = Arc::new(Fixed { ready: true });
    let past = Instant::now().checked_sub(Duration::from_millis(1));
    let io = IoRef { tx: &tx, id: 1 };
    let input = Input::One(Bytes::new());
    let Err((st, _)) = prepare(
        1,
        &handler,
        input,
        Metadata::new(),
        ctx("/s/M", past),
        io,
        None,
    ) else {
        panic!("started past its deadline");
    };
    assert_eq!(st.code(), Code::DeadlineExceeded);
}

#[test]
fn the_first_poll_answers_at_once_or_leaves_the_handler_running() {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    for ready in [true, false] {
        let handler: HandlerRef = Arc::new(Fixed { ready });
        let io = IoRef { tx: &tx, id: 7 };
        let input = Input::One(Bytes::new());
        let Ok(mut running) = prepare(
            7,
            &handler,
            input,
            Metadata::new(),
            ctx("/s/M", None),
            io,
            None,
        ) else {
            panic!("not started");
        };
        match first_poll(&mut running, &handler) {
            Poll::Ready((id, outcome, _)) => {
                assert!(ready, "a handler that never answers was done");
                assert_eq!(id, 7);
                assert!(matches!(outcome, Some(Outcome::Finished(Ok(_)))));
            }
            Poll::Pending => assert!(!ready, "a handler that answers at once was pending"),
        }
    }
}

#[test]
fn a_call_cancelled_before_its_first_poll_is_dropped_unpolled() {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let handler: HandlerRef = Arc::new(Fixed { ready: true });
    let io = IoRef { tx: &tx, id: 3 };
    let c = ctx("/s/M", None);
    c.cancel.cancel();
    let input = Input::One(Bytes::new());
    let Ok(mut running) = prepare(3, &handler, input, Metadata::new(), c, io, None) else {
        panic!("not started");
    };
    let Poll::Ready((_, outcome, _)) = first_poll(&mut running, &handler) else {
        panic!("a cancelled call is done at once");
    };
    assert!(
        outcome.is_none(),
        "a cancelled call has no outcome to answer"
    );
}

#[test]
fn a_reply_is_headers_then_its_message_then_an_ok_end_with_its_trailers() {
    let mut face = Face::default();
    answer(Outcome::Reply(Ok((payload(5), md(1), md(2)))), &mut face);
    assert_eq!(
        face.did,
        [Did::Headers(1), Did::Reply(5), Did::End(Code::Ok, 2)]
    );
}

#[test]
fn a_reply_that_waits_for_room_is_ended_by_its_face() {
    let mut face = Face {
        full: true,
        ..Face::default()
    };
    answer(Outcome::Reply(Ok((payload(5), md(0), md(0)))), &mut face);
    assert_eq!(face.did, [Did::Headers(0), Did::Reply(5)]);
}

#[test]
fn a_reply_whose_headers_fail_ends_with_that_status_and_sends_no_message() {
    let mut face = Face {
        refuse: true,
        ..Face::default()
    };
    answer(Outcome::Reply(Ok((payload(5), md(1), md(0)))), &mut face);
    assert_eq!(face.did, [Did::End(Code::Cancelled, 0)]);
}

#[test]
fn errors_and_finished_streams_end_the_call() {
    let mut face = Face::default();
    answer(Outcome::Reply(Err(Status::not_found("x"))), &mut face);
    answer(Outcome::Finished(Err(Status::aborted("y"))), &mut face);
    answer(Outcome::Finished(Ok(md(3))), &mut face);
    assert_eq!(
        face.did,
        [
            Did::End(Code::NotFound, 0),
            Did::End(Code::Aborted, 0),
            Did::End(Code::Ok, 3)
        ]
    );
}

#[test]
fn a_streaming_handlers_commands_reach_its_face() {
    let mut face = Face::default();
    let (ack, _) = oneshot::channel();
    for cmd in [
        SCmd::Headers {
            id: 1,
            metadata: md(2),
        },
        SCmd::Send {
            id: 1,
            message: payload(4),
            ack,
            compress: false,
        },
        SCmd::Credit { id: 1, bytes: 9 },
    ] {
        command(cmd, &mut face);
    }
    assert_eq!(
        face.did,
        [Did::Headers(2), Did::Send(4, false), Did::Credit(9)]
    );
}

/// A call that ends before its handler returned cancels the handler — ended by the face
/// (`over`) or dropped with its connection; once the handler returned, neither fires the
/// cancellation (a clone the application kept tells "done" from "abandoned"), and the handle
/// is reused when nothing else holds it.
#[test]
fn a_call_is_cancelled_only_if_it_ends_before_its_handler_returned() {
    let mut pool = Vec::new();
    let fired = |make: fn(Cancellation) -> Cancel, end: fn(Cancel, &mut Vec<Cancellation>)| {
        let handle = Cancellation::default();
        let kept = handle.clone();
        end(make(handle), &mut Vec::new());
        kept.is_cancelled()
    };
    let over = |c: Cancel, pool: &mut Vec<Cancellation>| c.over(Some(pool));
    let dropped = |c: Cancel, _: &mut Vec<Cancellation>| drop(c);
    assert!(fired(Cancel::running, over), "ended while running");
    assert!(fired(Cancel::running, dropped), "dropped while running");
    assert!(!fired(Cancel::returned, over), "ended after it returned");
    assert!(
        !fired(Cancel::returned, dropped),
        "dropped after it returned"
    );
    let mut c = Cancel::running(Cancellation::default());
    c.handler_returned();
    c.over(Some(&mut pool));
    assert_eq!(pool.len(), 1, "an unshared handle is reused");
    assert!(!pool[0].is_cancelled());
}

#[test]
fn a_waiting_call_keeps_its_one_request_and_starts_on_the_half_close() {
    let mut call: ServerCall = ServerCall::Waiting(waiting("/s/One"));
    let got = call.on_message(Bytes::from_static(b"a"), 7, false);
    assert_eq!(got.expect("the first"), Received::Kept);
    let (_, m) = call.on_half_closed().expect("one came").expect("it starts");
    assert_eq!(&m[..], b"a");
    assert!(matches!(call, ServerCall::Gone));
    // Nothing is left to cancel or let go.
    assert!(call.over(None, None).is_none());

    let mut call: ServerCall = ServerCall::Waiting(waiting("/s/None"));
    let st = call.on_half_closed().err().expect("none came");
    assert_eq!(st.message(), "/s/None takes one request message, got none");
    assert!(matches!(call, ServerCall::Gone));
}

#[test]
fn a_started_calls_requests_go_to_its_stream_until_the_half_close() {
    // Unbounded as the faces' request streams are; here it holds the two items sent below.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let cancel = Cancel::running(Cancellation::default());
    let mut call = ServerCall::started(cancel, Some(tx), ());
    let got = call.on_message(Bytes::from_static(b"a"), 5, true);
    assert_eq!(got.expect("queued"), Received::Queued);
    assert!(call.on_half_closed().expect("no error").is_none());
    assert!(matches!(rx.try_recv(), Ok(Item::Message(m, 5, true)) if &m[..] == b"a"));
    assert!(matches!(rx.try_recv(), Ok(Item::End(Ok(_)))));
    // After the half-close nobody takes a message: its credit is the face's to return.
    let got = call.on_message(Bytes::from_static(b"b"), 9, false);
    assert_eq!(got.expect("unwanted"), Received::Unwanted(9));

    // A unary call's handler has no stream at all.
    let cancel = Cancel::running(Cancellation::default());
    let mut call = ServerCall::started(cancel, None, ());
    let got = call.on_message(Bytes::from_static(b"c"), 3, false);
    assert_eq!(got.expect("unwanted"), Received::Unwanted(3));
}

#[test]
fn a_started_call_that_ends_cancels_its_running_handler_and_tells_its_stream_why() {
    // Holds the one item `over` sends.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let handle = Cancellation::default();
    let kept = handle.clone();
    let call = ServerCall::started(Cancel::running(handle), Some(tx), 42u8);
    let why = Status::cancelled("the client cancelled");
    assert_eq!(
        call.over(Some(&why), None),
        Some(42),
        "the face's side back"
    );
    assert!(kept.is_cancelled());
    assert!(matches!(rx.try_recv(), Ok(Item::End(Err(st))) if st.code() == Code::Cancelled));

    // Once its handler returned, its end cancels nothing.
    let handle = Cancellation::default();
    let kept = handle.clone();
    let mut call = ServerCall::started(Cancel::running(handle), None, ());
    call.handler_returned();
    let mut pool = Vec::new();
    call.over(None, Some(&mut pool));
    assert!(!kept.is_cancelled());

    // Dropped (its connection went) while the handler runs: cancelled.
    let handle = Cancellation::default();
    let kept = handle.clone();
    drop(ServerCall::started(Cancel::running(handle), None, ()));
    assert!(kept.is_cancelled());
}
