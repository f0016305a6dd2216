//! [`Streaming`]: a stream of received messages with flow control tied to consumption.

use crate::Status;
use bytes::Bytes;
use futures_util::Stream;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use topspin_proto::Metadata;

/// What a connection task delivers to a stream consumer.
#[derive(Debug)]
pub(crate) enum Item {
    Message(Bytes, u32),
    /// The stream ended: trailers on success (client side) or an error status.
    End(Result<Metadata, Status>),
}

/// Gives consumed credit back to the connection that delivered the messages.
pub(crate) trait CreditReturn: Send + Sync + 'static {
    fn give_back(&self, credit: u32);
    /// The consumer dropped the stream before its end.
    fn abandon(&self);
}

type Decoder<T> = Box<dyn FnMut(Bytes) -> Result<T, Status> + Send>;

/// Messages received on a streaming call, in order.
///
/// Flow control follows consumption: the peer may only send as far ahead as the call's window
/// (1 MiB by default) beyond what this stream has handed out, so a slow reader bounds the
/// sender's memory. Dropping a client-side `Streaming` before its end cancels the call.
///
/// Use [`Streaming::message`] or the [`Stream`] implementation.
pub struct Streaming<T> {
    rx: mpsc::UnboundedReceiver<Item>,
    decode: Decoder<T>,
    credit: Box<dyn CreditReturn>,
    trailers: Option<Metadata>,
    done: bool,
}

impl<T> std::fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("done", &self.done)
            .finish()
    }
}

impl<T> Streaming<T> {
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<Item>,
        decode: Decoder<T>,
        credit: Box<dyn CreditReturn>,
    ) -> Streaming<T> {
        Streaming {
            rx,
            decode,
            credit,
            trailers: None,
            done: false,
        }
    }

    /// The next message: `Ok(None)` at the end of the stream, `Err` if the call failed.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        std::future::poll_fn(|cx| self.poll_item(cx))
            .await
            .transpose()
    }

    /// The trailers, once the stream has ended successfully (client side).
    pub fn trailers(&self) -> Option<&Metadata> {
        self.trailers.as_ref()
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Item::Message(b, credit))) => {
                self.credit.give_back(credit);
                Poll::Ready(Some((self.decode)(b)))
            }
            Poll::Ready(Some(Item::End(Ok(trailers)))) => {
                self.done = true;
                self.trailers = Some(trailers);
                Poll::Ready(None)
            }
            Poll::Ready(Some(Item::End(Err(status)))) => {
                self.done = true;
                Poll::Ready(Some(Err(status)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(Status::unavailable(
                    "the connection closed before the stream ended",
                ))))
            }
        }
    }
}

impl<T> Stream for Streaming<T> {
    type Item = Result<T, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(cx)
    }
}

impl<T> Drop for Streaming<T> {
    fn drop(&mut self) {
        if !self.done {
            self.credit.abandon();
        }
    }
}
