//! `topspin call`: JSON in, protobuf on the wire, JSON out.

use crate::CallFailed;
use anyhow::{anyhow, bail, Context};
use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, BoxStream, StreamExt};
use prost::Message;
use prost_reflect::{
    DeserializeOptions, DynamicMessage, MessageDescriptor, MethodDescriptor, SerializeOptions,
};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use topspin::codec::{Codec, CODEC_PROTOBUF};
use topspin::{Channel, Metadata, Request, Status, Streaming};

/// Encoded protobuf both ways, under the protobuf codec id: the CLI encodes and decodes with
/// `prost-reflect` itself.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ProtobufBytes;

impl Codec for ProtobufBytes {
    type Encode = Bytes;
    type Decode = Bytes;
    const ID: u8 = CODEC_PROTOBUF;
    fn encode(&self, item: Bytes) -> Result<Bytes, Status> {
        Ok(item)
    }
    fn decode(&self, buf: Bytes) -> Result<Bytes, Status> {
        Ok(buf)
    }
}

/// Where request JSON comes from.
#[derive(Clone, Debug)]
pub(crate) enum Input {
    /// No `-d`: `{}` for a single request, JSON lines from stdin for a request stream.
    Default,
    /// `-d '{...}'`.
    Inline(String),
    /// `-d @file`.
    File(PathBuf),
    /// `-d @-`.
    Stdin,
}

impl Input {
    pub(crate) fn parse(arg: Option<&str>) -> Input {
        match arg {
            None => Input::Default,
            Some("@-") => Input::Stdin,
            Some(s) => match s.strip_prefix('@') {
                Some(path) => Input::File(PathBuf::from(path)),
                None => Input::Inline(s.to_owned()),
            },
        }
    }
}

/// How to print responses.
#[derive(Clone, Debug)]
pub(crate) struct Output {
    pub(crate) emit_defaults: bool,
    pub(crate) proto_names: bool,
    pub(crate) verbose: bool,
}

impl Output {
    fn options(&self) -> SerializeOptions {
        SerializeOptions::new()
            .skip_default_fields(!self.emit_defaults)
            .use_proto_field_name(self.proto_names)
    }

    fn print(&self, desc: &MessageDescriptor, bytes: Bytes, pretty: bool) -> anyhow::Result<()> {
        let msg = DynamicMessage::decode(desc.clone(), bytes)
            .with_context(|| format!("the response is not a valid {}", desc.full_name()))?;
        let mut out = std::io::stdout().lock();
        if pretty {
            let mut ser = serde_json::Serializer::pretty(&mut out);
            msg.serialize_with_options(&mut ser, &self.options())?;
        } else {
            let mut ser = serde_json::Serializer::new(&mut out);
            msg.serialize_with_options(&mut ser, &self.options())?;
        }
        out.write_all(b"\n")?;
        out.flush()?;
        Ok(())
    }

    fn metadata(&self, what: &str, md: &Metadata) {
        if !self.verbose {
            return;
        }
        for (k, v) in md.iter() {
            match std::str::from_utf8(v) {
                Ok(s) if !k.ends_with("-bin") => eprintln!("{what} {k}: {s}"),
                _ => eprintln!("{what} {k}: {v:?}"),
            }
        }
    }
}

/// Parses one JSON value as `desc`, naming the field that is wrong if it fails.
fn parse_message(desc: &MessageDescriptor, text: &str, what: &str) -> anyhow::Result<Bytes> {
    let mut de = serde_json::Deserializer::from_str(text);
    let msg = deserialize(desc, &mut de, what)?;
    de.end()
        .map_err(|e| anyhow!("{what}: unexpected data after the JSON object: {e}"))?;
    Ok(encode(&msg))
}

fn deserialize<'de, R: serde_json::de::Read<'de>>(
    desc: &MessageDescriptor,
    de: &mut serde_json::Deserializer<R>,
    what: &str,
) -> anyhow::Result<DynamicMessage> {
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(&mut *de, &mut track);
    DynamicMessage::deserialize_with_options(desc.clone(), tracked, &DeserializeOptions::new())
        .map_err(|e| {
            let path = track.path().to_string();
            if path.is_empty() || path == "." {
                anyhow!("{what} is not a valid {} in JSON: {e}", desc.full_name())
            } else {
                anyhow!(
                    "{what} is not a valid {} in JSON: field `{path}`: {e}",
                    desc.full_name()
                )
            }
        })
}

fn encode(msg: &DynamicMessage) -> Bytes {
    let mut buf = BytesMut::with_capacity(msg.encoded_len());
    msg.encode_raw(&mut buf);
    buf.freeze()
}

fn read_input(input: &Input) -> anyhow::Result<Option<String>> {
    Ok(match input {
        Input::Default => None,
        Input::Inline(s) => Some(s.clone()),
        Input::File(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("could not read {}", p.display()))?,
        ),
        Input::Stdin => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .context("could not read stdin")?;
            Some(s)
        }
    })
}

/// A request stream, and where a JSON error found while streaming it is reported.
fn request_stream(
    desc: &MessageDescriptor,
    input: &Input,
) -> anyhow::Result<(BoxStream<'static, Bytes>, oneshot::Receiver<anyhow::Error>)> {
    let (err_tx, err_rx) = oneshot::channel();
    match input {
        Input::Default | Input::Stdin => {
            // Lines are sent as they are typed, so a bidirectional call can be interactive.
            let (tx, rx) = mpsc::channel::<Bytes>(16);
            let desc = desc.clone();
            std::thread::spawn(move || {
                let stdin = std::io::stdin();
                for (n, line) in stdin.lock().lines().enumerate() {
                    let line = match line {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = err_tx.send(anyhow!("could not read stdin: {e}"));
                            return;
                        }
                    };
                    if line.trim().is_empty() {
                        continue;
                    }
                    match parse_message(&desc, &line, &format!("stdin line {}", n + 1)) {
                        Ok(b) => {
                            if tx.blocking_send(b).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            let _ = err_tx.send(e);
                            return;
                        }
                    }
                }
            });
            let s = stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
            Ok((s.boxed(), err_rx))
        }
        Input::Inline(_) | Input::File(_) => {
            let text = read_input(input)?.unwrap_or_default();
            let items = parse_many(desc, &text)?;
            Ok((stream::iter(items).boxed(), err_rx))
        }
    }
}

/// Every JSON value in `text` (JSON lines, or any whitespace-separated values), in order.
fn parse_many(desc: &MessageDescriptor, text: &str) -> anyhow::Result<Vec<Bytes>> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<serde_json::Value>();
    while let Some(v) = values.next() {
        let end = values.byte_offset();
        v.map_err(|e| anyhow!("request {} is not valid JSON: {e}", out.len() + 1))?;
        let what = format!("request {}", out.len() + 1);
        out.push(parse_message(desc, &text[offset..end], &what)?);
        offset = end;
    }
    Ok(out)
}

/// Makes the call and prints the responses.
pub(crate) async fn call(
    channel: &Channel,
    method: &MethodDescriptor,
    input: &Input,
    metadata: Metadata,
    timeout: Option<Duration>,
    output: &Output,
) -> anyhow::Result<()> {
    let path = format!("/{}/{}", method.parent_service().full_name(), method.name());
    let input_desc = method.input();
    let output_desc = method.output();
    fn with<T>(message: T, metadata: &Metadata, timeout: Option<Duration>) -> Request<T> {
        let r = Request::new(message).with_metadata(metadata.clone());
        match timeout {
            Some(t) => r.with_timeout(t),
            None => r,
        }
    }
    let single = |input: &Input| -> anyhow::Result<Bytes> {
        let text = read_input(input)?.unwrap_or_else(|| "{}".to_owned());
        parse_message(&input_desc, &text, "the request")
    };
    match (method.is_client_streaming(), method.is_server_streaming()) {
        (false, false) => {
            let req = with(single(input)?, &metadata, timeout);
            let resp = channel
                .unary(ProtobufBytes, path, req)
                .await
                .map_err(CallFailed)?;
            output.metadata("<", resp.metadata());
            output.metadata("< trailer", resp.trailers());
            output.print(&output_desc, resp.into_inner(), true)
        }
        (false, true) => {
            let req = with(single(input)?, &metadata, timeout);
            let resp = channel
                .server_streaming(ProtobufBytes, path, req)
                .await
                .map_err(CallFailed)?;
            drain(resp.into_inner(), &output_desc, output).await
        }
        (true, false) => {
            let (requests, mut err) = request_stream(&input_desc, input)?;
            let call =
                channel.client_streaming(ProtobufBytes, path, with(requests, &metadata, timeout));
            tokio::select! {
                r = call => {
                    if let Ok(e) = err.try_recv() {
                        return Err(e);
                    }
                    let resp = r.map_err(CallFailed)?;
                    output.metadata("<", resp.metadata());
                    output.metadata("< trailer", resp.trailers());
                    output.print(&output_desc, resp.into_inner(), true)
                }
                Ok(e) = &mut err => Err(e),
            }
        }
        (true, true) => {
            let (requests, mut err) = request_stream(&input_desc, input)?;
            let run = async {
                let resp = channel
                    .streaming(ProtobufBytes, path, with(requests, &metadata, timeout))
                    .await
                    .map_err(CallFailed)?;
                drain(resp.into_inner(), &output_desc, output).await
            };
            tokio::select! {
                r = run => {
                    if let Ok(e) = err.try_recv() {
                        return Err(e);
                    }
                    r
                }
                Ok(e) = &mut err => Err(e),
            }
        }
    }
}

/// Prints a response stream as JSON lines, after its headers: a streaming call returns before
/// them, and they arrive at the latest with the first message (or the end). A call that failed
/// before any response fails on the first message.
async fn drain(
    mut stream: Streaming<Bytes>,
    desc: &MessageDescriptor,
    output: &Output,
) -> anyhow::Result<()> {
    if let Ok(headers) = stream.headers().await {
        output.metadata("<", headers);
    }
    while let Some(msg) = stream.message().await.map_err(CallFailed)? {
        output.print(desc, msg, false)?;
    }
    if let Some(t) = stream.trailers() {
        output.metadata("< trailer", t);
    }
    Ok(())
}

/// Parses `-H key:value` into metadata, as grpcurl does: keys are lower-cased (metadata keys
/// are lower case on the wire), and the values of `-bin` keys are base64, in any of its
/// flavours (standard or URL-safe, padded or not).
pub(crate) fn metadata(headers: &[String]) -> anyhow::Result<Metadata> {
    let mut b = Metadata::builder();
    for h in headers {
        let Some((k, v)) = h.split_once(':') else {
            bail!("header {h:?} is not key:value");
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        b = if k.ends_with("-bin") {
            let bytes = base64_decode(v).with_context(|| {
                format!("header {k:?}: the value of a -bin key must be base64, {v:?} is not")
            })?;
            b.binary(&k, &bytes)
        } else {
            b.text(&k, v)
        }
        .map_err(|e| anyhow!("header {h:?}: {e}"))?;
    }
    Ok(b.build())
}

/// Decodes base64 of any flavour: standard or URL-safe alphabet, with or without padding.
fn base64_decode(value: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
    use base64::engine::DecodePaddingMode;
    use base64::Engine;
    let lenient =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    let standard = GeneralPurpose::new(&base64::alphabet::STANDARD, lenient);
    let url_safe = GeneralPurpose::new(&base64::alphabet::URL_SAFE, lenient);
    standard
        .decode(value)
        .or_else(|e| url_safe.decode(value).map_err(|_| e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs() {
        assert!(matches!(Input::parse(None), Input::Default));
        assert!(matches!(Input::parse(Some("@-")), Input::Stdin));
        assert!(
            matches!(Input::parse(Some("@a.json")), Input::File(p) if p == std::path::Path::new("a.json"))
        );
        assert!(matches!(Input::parse(Some("{}")), Input::Inline(s) if s == "{}"));
    }

    #[test]
    fn headers() {
        let md = metadata(&["User: ann".into(), "Trace-Bin:eHl6".into()]).unwrap();
        assert_eq!(md.get_str("user"), Some("ann"));
        assert_eq!(md.get("trace-bin"), Some(&b"xyz"[..]));
        for flavour in ["AAH/", "AAH_", "AAE=", "AAE"] {
            assert!(base64_decode(flavour).is_ok(), "{flavour}");
        }
        let e = metadata(&["trace-bin: xyz!".into()]).unwrap_err();
        assert!(format!("{e:#}").contains("must be base64"), "{e:#}");
        assert!(metadata(&["no-colon".into()]).is_err());
        assert!(metadata(&["Bad Key:v".into()]).is_err());
    }

    #[test]
    fn json_values_and_errors() {
        let pool = topspin_reflection::Reflection::new(&[])
            .unwrap()
            .pool()
            .clone();
        let desc = pool
            .get_message_by_name("topspin.reflection.v1.MethodInfo")
            .unwrap();
        let many = parse_many(&desc, "{\"name\": \"a\"}\n{\"name\": \"b\"} {}").unwrap();
        assert_eq!(many.len(), 3);
        let err = parse_many(&desc, "{\"name\": \"a\"}\n{\"clientStreaming\": 3}").unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("request 2 "), "{text}");
        assert!(text.contains("field `clientStreaming`"), "{text}");
        let err = parse_message(&desc, "{\"name\": \"a\"} x", "the request").unwrap_err();
        assert!(err.to_string().contains("unexpected data"), "{err}");
    }
}
