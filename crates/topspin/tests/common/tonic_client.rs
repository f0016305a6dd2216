//! A client of the standard test service that is either a topspin `Channel` or tonic's client
//! ([`super::Transport::TonicClient`]: tonic against a topspin server's gRPC face), so that the
//! cells written over it ([`super::each_client`]) run with both. It has what those cells use:
//! a unary call (metadata and a timeout in, headers, trailers or a status out) and a server
//! stream read to its end.

use super::tonic_service::Raw;
use bytes::Bytes;
use topspin::codec::RawCodec;
use topspin::{Channel, Code, Metadata, Request, Response, Status};

/// A topspin channel, or tonic's client on a connection of its own.
#[derive(Clone)]
pub enum Client {
    Topspin(Channel),
    Tonic(tonic::client::Grpc<tonic::transport::Channel>),
}

/// What a server stream brought: its messages, then its trailers (ended OK) or its status.
pub type Streamed = (Vec<Bytes>, Result<Metadata, Status>);

impl Client {
    /// Dials `host_port` with tonic's client (h2c).
    pub async fn tonic(host_port: &str) -> Result<Client, Status> {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{host_port}"))
            .map_err(|e| Status::internal(e.to_string()))?
            .connect()
            .await
            .map_err(|e| Status::unavailable(format!("tonic: connect {host_port}: {e}")))?;
        Ok(Client::Tonic(tonic::client::Grpc::new(ch)))
    }

    /// A unary call of `body`: the reply's message.
    pub async fn call(&self, method: &'static str, body: &str) -> Result<Bytes, Status> {
        let req = Request::new(Bytes::copy_from_slice(body.as_bytes()));
        self.unary(method, req).await.map(|r| r.into_inner())
    }

    /// A unary call: the reply with its headers (`metadata()`) and trailers (`trailers()`),
    /// or the call's status.
    pub async fn unary(
        &self,
        method: &'static str,
        req: Request<Bytes>,
    ) -> Result<Response<Bytes>, Status> {
        match self {
            Client::Topspin(ch) => ch.unary(RawCodec, method, req).await,
            Client::Tonic(g) => {
                // As tonic's own unary call, but keeping the headers and the trailers apart
                // (tonic's `unary` merges them).
                let (mut messages, end, headers) = tonic_stream(g, method, req).await?;
                let trailers = end?;
                if messages.len() != 1 {
                    return Err(Status::internal(format!(
                        "{} response messages for a unary call",
                        messages.len()
                    )));
                }
                Ok(Response::new(messages.pop().unwrap())
                    .with_metadata(headers)
                    .with_trailers(trailers))
            }
        }
    }

    /// A server-streaming call, read to its end.
    pub async fn server_streaming(&self, method: &'static str, req: Request<Bytes>) -> Streamed {
        match self {
            Client::Topspin(ch) => {
                let mut s = match ch.server_streaming(RawCodec, method, req).await {
                    Ok(r) => r.into_inner(),
                    Err(e) => return (Vec::new(), Err(e)),
                };
                let mut messages = Vec::new();
                loop {
                    match s.message().await {
                        Ok(Some(m)) => messages.push(m),
                        Ok(None) => {
                            let trailers = s.trailers().cloned();
                            let no_trailers =
                                || Status::internal("the stream ended without trailers");
                            return (messages, trailers.ok_or_else(no_trailers));
                        }
                        Err(e) => return (messages, Err(e)),
                    }
                }
            }
            Client::Tonic(g) => match tonic_stream(g, method, req).await {
                Ok((messages, end, _)) => (messages, end),
                Err(e) => (Vec::new(), Err(e)),
            },
        }
    }
}

/// A call through tonic's client, read to its end: the messages, the trailers or the status,
/// the response headers.
async fn tonic_stream(
    g: &tonic::client::Grpc<tonic::transport::Channel>,
    method: &'static str,
    req: Request<Bytes>,
) -> Result<(Vec<Bytes>, Result<Metadata, Status>, Metadata), Status> {
    let mut g = g.clone();
    g.ready()
        .await
        .map_err(|e| Status::unavailable(format!("tonic: {e}")))?;
    let mut treq = tonic::Request::new(req.get_ref().clone());
    // The metadata first: tonic keeps the timeout in it (grpc-timeout).
    *treq.metadata_mut() = to_tonic(req.metadata());
    if let Some(t) = req.timeout() {
        treq.set_timeout(t);
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(method);
    let resp = g
        .server_streaming(treq, path, Raw)
        .await
        .map_err(from_tonic)?;
    let (headers, mut s, _) = resp.into_parts();
    let mut messages = Vec::new();
    let end = loop {
        match s.message().await {
            Ok(Some(m)) => messages.push(m),
            Ok(None) => break s.trailers().await.map(|t| from_map(&t.unwrap_or_default())),
            Err(e) => break Err(e),
        }
    };
    Ok((messages, end.map_err(from_tonic), from_map(&headers)))
}

/// topspin metadata as tonic's (`-bin` values binary, the others ASCII).
fn to_tonic(md: &Metadata) -> tonic::metadata::MetadataMap {
    use tonic::metadata::{AsciiMetadataKey, BinaryMetadataKey, MetadataValue};
    let mut map = tonic::metadata::MetadataMap::new();
    for (k, v) in md.iter() {
        if k.ends_with("-bin") {
            let key = BinaryMetadataKey::from_bytes(k.as_bytes()).expect("a -bin key");
            map.append_bin(key, MetadataValue::from_bytes(v));
        } else {
            let key = AsciiMetadataKey::from_bytes(k.as_bytes()).expect("a metadata key");
            let value = MetadataValue::try_from(v).expect("an ASCII metadata value");
            map.append(key, value);
        }
    }
    map
}

/// tonic's metadata as topspin's, without HTTP's and gRPC's own headers (as topspin's client
/// mode leaves them out).
fn from_map(map: &tonic::metadata::MetadataMap) -> Metadata {
    use tonic::metadata::KeyAndValueRef;
    let mut b = Metadata::builder();
    for kv in map.iter() {
        b = match kv {
            KeyAndValueRef::Ascii(k, v) => {
                let k = k.as_str();
                if k.starts_with("grpc-") || matches!(k, "content-type" | "te" | "date") {
                    continue;
                }
                b.text(k, v.to_str().expect("ASCII"))
                    .expect("valid metadata")
            }
            KeyAndValueRef::Binary(k, v) => {
                if k.as_str().starts_with("grpc-") {
                    continue;
                }
                let bytes = v.to_bytes().expect("base64");
                b.binary(k.as_str(), &bytes).expect("valid metadata")
            }
        };
    }
    b.build()
}

/// tonic's status as topspin's: code, message, details and trailers.
fn from_tonic(s: tonic::Status) -> Status {
    Status::new(Code::from_u16(s.code() as i32 as u16), s.message())
        .with_details(Bytes::copy_from_slice(s.details()))
        .with_metadata(from_map(s.metadata()))
}
