//! [`Streaming`]: a stream of received messages with flow control tied to consumption.

use crate::Status;
use bytes::Bytes;
use futures_util::Stream;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::sync::mpsc;
use topspin_proto::Metadata;

/// What a connection task delivers to a stream consumer.
#[derive(Debug)]
pub(crate) enum Item {
    /// A message, the credit it takes, and whether it arrived compressed: `true` only from a
    /// face that decompressed it itself (the gRPC face, whose frame prefix has the flag). A
    /// native message keeps its flag byte for the call's decoder ([`Streaming::new`]).
    Message(Bytes, u32, bool),
    /// The stream ended: trailers on success (client side) or an error status.
    End(Result<Metadata, Status>),
}

/// Gives consumed credit back to the connection that delivered the messages.
pub(crate) trait CreditReturn: Send + Sync + 'static {
    fn give_back(&self, credit: u32);
    /// The consumer dropped the stream before its end.
    fn abandon(&self);
}

pub(crate) type Decoder<T> = Box<dyn FnMut(Bytes) -> Result<T, Status> + Send>;

/// A client stream's wait for its response headers: the server's HEADERS, or empty ones when
/// its first message or its end came first (protocol.md §5.4). It decides how the messages
/// decode (their encoding is named in the headers) and may start the call again while no
/// response has arrived (`retry`): then it brings that attempt's receiver and credit.
pub(crate) type Opening<T> = Pin<Box<dyn Future<Output = Result<Opened<T>, Status>> + Send>>;

/// What an [`Opening`] ends with.
pub(crate) struct Opened<T> {
    pub(crate) headers: Metadata,
    pub(crate) decode: Decoder<T>,
    /// The headers name an encoding: the messages start with the native flag byte, which
    /// `decode` reads (protocol.md §15).
    pub(crate) flagged: bool,
    /// The attempt that answered, when it is not the one the stream was made with.
    pub(crate) attempt: Option<(mpsc::UnboundedReceiver<Item>, Box<dyn CreditReturn>)>,
}

/// Where a stream is with its response headers.
enum Head<T> {
    /// Not known yet (a client stream).
    Opening(Opening<T>),
    Open(Metadata),
    /// The call failed before any response: the first message (and `headers`) report it.
    Failed(Status),
}

/// Messages received on a streaming call, in order.
///
/// Flow control follows consumption: the peer may only send as far ahead as the call's window
/// (1 MiB by default) beyond what this stream has handed out, so a slow reader bounds the
/// sender's memory. Dropping a client-side `Streaming` before its end cancels the call.
///
/// On a client, a streaming call returns its `Streaming` as soon as the call is started: the
/// response headers come later, through [`Streaming::headers`] — a server may send them only
/// with its first message or its end (protocol.md §5.4). A call that fails before any
/// response (a status from the server, a lost connection) reports it through the first
/// [`Streaming::message`].
///
/// Use [`Streaming::message`] or the [`Stream`] implementation.
pub struct Streaming<T> {
    rx: mpsc::UnboundedReceiver<Item>,
    decode: Decoder<T>,
    credit: Box<dyn CreditReturn>,
    head: Head<T>,
    trailers: Option<Metadata>,
    done: bool,
    /// The messages start with the native flag byte (protocol.md §15), which the decoder reads.
    flagged: bool,
    /// The message last returned arrived compressed.
    last_compressed: bool,
}

impl<T> std::fmt::Debug for Streaming<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streaming")
            .field("done", &self.done)
            .finish()
    }
}

impl<T> Streaming<T> {
    /// A server's request stream. `flagged`: its messages start with the native flag byte
    /// (protocol.md §15: 0 as is, 1 compressed), which `decode` reads and strips.
    pub(crate) fn new(
        rx: mpsc::UnboundedReceiver<Item>,
        decode: Decoder<T>,
        credit: Box<dyn CreditReturn>,
        flagged: bool,
    ) -> Streaming<T> {
        Streaming {
            rx,
            decode,
            credit,
            head: Head::Open(Metadata::new()),
            trailers: None,
            done: false,
            flagged,
            last_compressed: false,
        }
    }

    /// A client's response stream whose headers are still to come: `opening` waits for them
    /// and gives the decoder.
    pub(crate) fn opening(
        rx: mpsc::UnboundedReceiver<Item>,
        credit: Box<dyn CreditReturn>,
        opening: Opening<T>,
    ) -> Streaming<T> {
        Streaming {
            rx,
            // Never called: messages are read only once `opening` has given the decoder.
            decode: Box::new(|_| Err(Status::internal("a message before the response headers"))),
            credit,
            head: Head::Opening(opening),
            trailers: None,
            done: false,
            flagged: false,
            last_compressed: false,
        }
    }

    /// The response headers, once they have arrived (client side): the server's HEADERS, or
    /// empty headers when the server sent its first message or ended the call without them
    /// (protocol.md §5.4). Returns at once when they are already here. `Err` when the call
    /// failed before any response: the status the first [`Streaming::message`] reports too.
    /// Messages that arrive meanwhile stay queued for [`Streaming::message`].
    ///
    /// On a server's request stream: empty (the request's metadata is on its `Request`).
    ///
    /// ```no_run
    /// # async fn f(channel: topspin::Channel) -> Result<(), topspin::Status> {
    /// use bytes::Bytes;
    /// use topspin::codec::RawCodec;
    /// let mut updates = channel
    ///     .server_streaming(RawCodec, "/feed.Feed/Subscribe", Bytes::from("prices"))
    ///     .await? // returns once the call is started, before any answer
    ///     .into_inner();
    /// let headers = updates.headers().await?; // waits for the server's first answer
    /// println!("served by {:?}", headers.get_str("server"));
    /// while let Some(update) = updates.message().await? {
    ///     println!("{update:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn headers(&mut self) -> Result<&Metadata, Status> {
        std::future::poll_fn(|cx| self.poll_open(cx)).await;
        match &self.head {
            Head::Open(headers) => Ok(headers),
            Head::Failed(status) => Err(status.clone()),
            Head::Opening(_) => Err(Status::internal("the response headers were not settled")),
        }
    }

    /// The response headers if they have arrived, without waiting: `Some` once
    /// [`Streaming::headers`] returned them or [`Streaming::message`] returned its first item;
    /// `None` before, and when the call failed before any response.
    pub fn received_headers(&self) -> Option<&Metadata> {
        match &self.head {
            Head::Open(headers) => Some(headers),
            _ => None,
        }
    }

    /// Waits for the response headers (a client stream's first item); then the stream reads
    /// its messages with the decoder they select.
    fn poll_open(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Head::Opening(opening) = &mut self.head else {
            return Poll::Ready(());
        };
        let r = ready!(opening.as_mut().poll(cx));
        self.head = match r {
            Ok(opened) => {
                self.decode = opened.decode;
                self.flagged = opened.flagged;
                if let Some((rx, credit)) = opened.attempt {
                    self.rx = rx;
                    self.credit = credit;
                }
                Head::Open(opened.headers)
            }
            Err(status) => {
                // The call is over, or is ended now (headers naming an encoding this side
                // does not decode).
                self.credit.abandon();
                Head::Failed(status)
            }
        };
        Poll::Ready(())
    }

    /// The next message: `Ok(None)` at the end of the stream, `Err` if the call failed.
    pub async fn message(&mut self) -> Result<Option<T>, Status> {
        std::future::poll_fn(|cx| self.poll_item(cx))
            .await
            .transpose()
    }

    /// Cancels the call this stream belongs to (client side), as dropping it would, but keeps
    /// the handle: the server is sent CANCEL (its handler's cancellation fires), messages not
    /// read yet are dropped, and the next [`Streaming::message`] returns `CANCELLED` ("cancelled
    /// by the caller") — as a gRPC client sees a call it cancelled itself. Nothing happens once
    /// the stream has ended. On a server's request stream: the rest of it is not read.
    ///
    /// ```no_run
    /// # async fn f(channel: topspin::Channel) -> Result<(), topspin::Status> {
    /// use bytes::Bytes;
    /// use topspin::{codec::RawCodec, Code};
    /// let mut updates = channel
    ///     .server_streaming(RawCodec, "/feed.Feed/Subscribe", Bytes::from("prices"))
    ///     .await?
    ///     .into_inner();
    /// let first = updates.message().await?;
    /// updates.cancel(); // enough
    /// assert_eq!(updates.message().await.unwrap_err().code(), Code::Cancelled);
    /// # Ok(()) }
    /// ```
    pub fn cancel(&mut self) {
        if self.done || matches!(self.head, Head::Failed(_)) {
            return;
        }
        self.credit.abandon();
        self.rx.close();
        self.head = Head::Failed(Status::cancelled("cancelled by the caller"));
    }

    /// Whether the message [`Streaming::message`] (or the [`Stream`] implementation) returned
    /// last arrived compressed: a server's request stream or a client's response stream, on
    /// either face. A call's encoding ([`Request::encoding`]; the response headers on a client)
    /// says how its messages may be compressed; each message still says whether it is — a
    /// peer may send some as they are (gRPC's compressed flag 0; topspin's flag byte 0,
    /// protocol.md §15), e.g. one under its compression's threshold or while its
    /// [`MessageCompression`] is off. `false` before the first message.
    ///
    /// Read it after each message, as gRPC's interop case `client_compressed_streaming`
    /// checks its requests' `expect_compressed`:
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use bytes::Bytes;
    /// use futures_util::{stream, StreamExt};
    /// use topspin::codec::RawCodec;
    /// use topspin::{Channel, Compression, Encoding, MessageCompression, Request, Response, Server};
    ///
    /// let server = Server::builder()
    ///     .client_streaming("/demo.D/Flags", RawCodec, |req: Request<topspin::Streaming<Bytes>>| async move {
    ///         let mut requests = req.into_inner();
    ///         let mut seen = Vec::new();
    ///         while let Some(_message) = requests.message().await? {
    ///             seen.push(if requests.last_message_compressed() { b'c' } else { b'-' });
    ///         }
    ///         Ok(Response::new(Bytes::from(seen)))
    ///     })
    ///     .bind("tcp://127.0.0.1:0")
    ///     .await?;
    /// let address = server.local_addr().clone();
    /// let shutdown = server.shutdown_handle();
    /// tokio::spawn(server.serve());
    /// let channel = Channel::connect(address).await?;
    ///
    /// // A gzip call whose second message goes as it is.
    /// let switch = MessageCompression::new();
    /// let flip = switch.clone();
    /// let messages = stream::iter([0, 1]).map(move |i| {
    ///     flip.set_enabled(i == 0);
    ///     Bytes::from(vec![b'x'; 1000])
    /// });
    /// let req = Request::new(messages)
    ///     .with_compression(Some(Compression::new(Encoding::Gzip).with_threshold(0)))
    ///     .with_message_compression(&switch);
    /// let seen = channel.client_streaming(RawCodec, "/demo.D/Flags", req).await?;
    /// assert_eq!(&seen.get_ref()[..], b"c-");
    /// shutdown.shutdown(std::time::Duration::from_secs(1)).await;
    /// # Ok(()) }
    /// ```
    ///
    /// [`Request::encoding`]: crate::Request::encoding
    /// [`MessageCompression`]: crate::MessageCompression
    pub fn last_message_compressed(&self) -> bool {
        self.last_compressed
    }

    /// The trailers, once the stream has ended successfully (client side).
    pub fn trailers(&self) -> Option<&Metadata> {
        self.trailers.as_ref()
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, Status>>> {
        if !matches!(self.head, Head::Open(_)) {
            ready!(self.poll_open(cx));
            if let Head::Failed(status) = &self.head {
                if self.done {
                    return Poll::Ready(None);
                }
                // The stream's one item: the call's failure.
                self.done = true;
                return Poll::Ready(Some(Err(status.clone())));
            }
        }
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Item::Message(b, credit, compressed))) => {
                self.credit.give_back(credit);
                self.last_compressed =
                    compressed || (self.flagged && crate::compression::flagged_compressed(&b));
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
        // A call that failed before any response was abandoned then.
        if !self.done && !matches!(self.head, Head::Failed(_)) {
            self.credit.abandon();
        }
    }
}
