//! The delivery rules of one call's outcome, sans IO: both client modes feed these same calls.

use super::*;
use crate::client::completion::{Pool, Waiter};
use futures_util::FutureExt;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

type Reply = Result<Response<Bytes>, Status>;

fn unary() -> (Outcome, Waiter<Reply>) {
    let (tx, rx) = Arc::new(Pool::default()).pair();
    (Outcome::new(Sink::Unary(tx)), rx)
}

fn result(rx: Waiter<Reply>) -> Reply {
    rx.now_or_never()
        .expect("the outcome went out")
        .expect("a value, not an abandoned completer")
}

struct Stream {
    headers: oneshot::Receiver<Result<Metadata, Status>>,
    items: mpsc::UnboundedReceiver<Item>,
}

fn stream() -> (Outcome, Stream) {
    let (h, headers) = oneshot::channel();
    // Unbounded as `Sink::Stream`'s item channel is: bounded by the call's receive window
    // (each item holds credit until the consumer takes it); here, by the test's few messages.
    let (i, items) = mpsc::unbounded_channel();
    let sink = Sink::Stream {
        headers: Some(h),
        items: i,
    };
    (Outcome::new(sink), Stream { headers, items })
}

fn md(k: &str, v: &str) -> Metadata {
    Metadata::builder().text(k, v).unwrap().build()
}

const METHOD: &str = "/t.S/M";

#[test]
fn a_second_message_of_a_unary_call_fails_it_once_in_one_wording() {
    let (mut o, rx) = unary();
    assert_eq!(
        o.on_message(Bytes::from_static(b"a"), 7, false, METHOD),
        Ok(0)
    );
    assert_eq!(
        o.on_message(Bytes::from_static(b"b"), 7, false, METHOD),
        Err(Broken)
    );
    assert!(o.is_over());
    // What follows on the wire changes nothing: the caller was told once.
    assert_eq!(
        o.on_message(Bytes::from_static(b"c"), 7, false, METHOD),
        Ok(0)
    );
    o.on_end(Status::ok(), Metadata::new(), METHOD);
    let e = result(rx).unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    // (The whole wording, over both modes and every transport: tests/unary.rs.)
    assert!(
        e.message().ends_with(" for /t.S/M, which expects one"),
        "{e}"
    );
}

#[test]
fn a_unary_call_gets_its_message_headers_and_trailers() {
    let (mut o, rx) = unary();
    o.on_headers(md("h", "1"));
    assert_eq!(
        o.on_message(Bytes::from_static(b"m"), 9, false, METHOD),
        Ok(0)
    );
    o.on_end(Status::ok(), md("t", "2"), METHOD);
    let (m, headers, trailers) = result(rx).unwrap().into_parts();
    assert_eq!(m, Bytes::from_static(b"m"));
    assert_eq!(headers.get_str("h"), Some("1"));
    assert_eq!(trailers.get_str("t"), Some("2"));
}

#[test]
fn ok_without_a_message_is_internal() {
    let (mut o, rx) = unary();
    o.on_end(Status::ok(), Metadata::new(), METHOD);
    let e = result(rx).unwrap_err();
    assert_eq!(e.code(), Code::Internal);
    assert_eq!(
        e.message(),
        "the server ended /t.S/M with OK but sent no response message"
    );
}

#[test]
fn an_error_keeps_its_trailers_and_a_unary_calls_headers() {
    let (mut o, rx) = unary();
    o.on_headers(md("h", "1"));
    o.on_end(Status::not_found("gone"), md("why", "asked"), METHOD);
    let e = result(rx).unwrap_err();
    assert_eq!((e.code(), e.message()), (Code::NotFound, "gone"));
    assert_eq!(e.metadata().get_str("why"), Some("asked"));
    assert_eq!(e.headers().get_str("h"), Some("1"));
    assert!(!e.is_unprocessed());
}

#[test]
fn a_stream_gets_headers_then_messages_with_their_credit_then_its_end() {
    let (mut o, mut s) = stream();
    o.on_headers(md("h", "1"));
    assert_eq!(
        o.on_message(Bytes::from_static(b"a"), 5, false, METHOD),
        Ok(5)
    );
    assert_eq!(
        o.on_message(Bytes::from_static(b"b"), 6, true, METHOD),
        Ok(6)
    );
    o.on_end(Status::ok(), md("t", "2"), METHOD);
    let h = s.headers.try_recv().unwrap().unwrap();
    assert_eq!(h.get_str("h"), Some("1"));
    assert!(matches!(s.items.try_recv(), Ok(Item::Message(m, 5, false)) if m == "a"));
    assert!(
        matches!(s.items.try_recv(), Ok(Item::Message(m, 6, true)) if m == "b"),
        "the decompressed flag goes with it"
    );
    match s.items.try_recv() {
        Ok(Item::End(Ok(t))) => assert_eq!(t.get_str("t"), Some("2")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_stream_without_headers_gets_empty_ones_with_its_first_message_or_end() {
    let (mut o, mut s) = stream();
    assert_eq!(
        o.on_message(Bytes::from_static(b"a"), 5, false, METHOD),
        Ok(5)
    );
    assert!(s.headers.try_recv().unwrap().unwrap().is_empty());
    let (mut o, mut s) = stream();
    o.on_end(Status::ok(), Metadata::new(), METHOD);
    assert!(s.headers.try_recv().unwrap().unwrap().is_empty());
    assert!(matches!(s.items.try_recv(), Ok(Item::End(Ok(_)))));
}

#[test]
fn a_call_the_server_did_not_process_is_marked_for_transparent_retry() {
    let (mut o, rx) = unary();
    o.on_headers(md("h", "1"));
    o.unprocessed(Status::unavailable("going away"));
    let e = result(rx).unwrap_err();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.is_unprocessed());
    assert!(e.headers().is_empty());
    // A stream fails through its headers (none came yet).
    let (mut o, mut s) = stream();
    o.unprocessed(Status::unavailable("refused"));
    assert!(s.headers.try_recv().unwrap().unwrap_err().is_unprocessed());
}

#[test]
fn only_unavailable_refusals_before_the_write_are_unprocessed() {
    assert!(refused_unsent(Status::unavailable("closed")).is_unprocessed());
    assert!(!refused_unsent(Status::resource_exhausted("too large")).is_unprocessed());
    let s = not_sent("the connection closed");
    assert_eq!(s.code(), Code::Unavailable);
    assert!(s.is_unprocessed());
    assert_eq!(
        s.message(),
        "the connection closed; the call was not sent and is safe to retry"
    );
}
