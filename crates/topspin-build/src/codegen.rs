//! The service generator: server trait, `XxxServer<T>`, `XxxClient` and method descriptors.

use heck::{ToShoutySnakeCase, ToSnakeCase, ToUpperCamelCase};
use prost_build::{Comments, Method, Service, ServiceGenerator};
use std::fmt::Write;

pub(crate) struct ServiceGen {
    pub(crate) server: bool,
    pub(crate) client: bool,
}

/// The `FILE_DESCRIPTOR_SET` constant appended to every generated package file.
pub(crate) fn descriptor_set_const(file_name: &str) -> String {
    format!(
        "/// The encoded `google.protobuf.FileDescriptorSet` of the `.proto` files this code was\n\
         /// generated from, with their imports and comments: serve it with server reflection.\n\
         pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!({file_name:?});\n"
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Unary,
    ServerStreaming,
    ClientStreaming,
    Bidirectional,
}

impl Kind {
    fn of(m: &Method) -> Kind {
        match (m.client_streaming, m.server_streaming) {
            (false, false) => Kind::Unary,
            (false, true) => Kind::ServerStreaming,
            (true, false) => Kind::ClientStreaming,
            (true, true) => Kind::Bidirectional,
        }
    }
    fn variant(self) -> &'static str {
        match self {
            Kind::Unary => "Unary",
            Kind::ServerStreaming => "ServerStreaming",
            Kind::ClientStreaming => "ClientStreaming",
            Kind::Bidirectional => "Bidirectional",
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Kind::Unary => "unary",
            Kind::ServerStreaming => "server streaming",
            Kind::ClientStreaming => "client streaming",
            Kind::Bidirectional => "bidirectional streaming",
        }
    }
    fn builder_fn(self) -> &'static str {
        match self {
            Kind::Unary => "unary",
            Kind::ServerStreaming => "server_streaming",
            Kind::ClientStreaming => "client_streaming",
            Kind::Bidirectional => "streaming",
        }
    }
}

struct M<'a> {
    m: &'a Method,
    kind: Kind,
    /// `/pkg.Service/Method`
    path: String,
    /// `GET_THING`
    konst: String,
    /// `GetThingStream`
    stream_ty: String,
}

fn strip_dot(s: &str) -> &str {
    s.strip_prefix('.').unwrap_or(s)
}

/// The service name as written in `.proto`, made into a snake-case module prefix.
fn module_prefix(service: &Service) -> String {
    let s = service.proto_name.to_snake_case();
    s.strip_prefix("r#").unwrap_or(&s).to_owned()
}

/// Clippy allowances for method names that look like conversions or constructors.
fn lint_allows(method: &str) -> &'static str {
    if method == "new" {
        "#[allow(clippy::new_ret_no_self, clippy::wrong_self_convention)]\n"
    } else if ["as_", "from_", "into_", "is_", "to_"]
        .iter()
        .any(|p| method.starts_with(p))
    {
        "#[allow(clippy::wrong_self_convention)]\n"
    } else {
        ""
    }
}

fn doc(buf: &mut String, comments: &Comments, fallback: &str) {
    let mut c = comments.clone();
    c.leading_detached.clear();
    if c.leading.is_empty() && c.trailing.is_empty() {
        let _ = writeln!(buf, "/// {fallback}");
    } else {
        c.append_with_indent(0, buf);
        let _ = writeln!(buf, "///\n/// {fallback}");
    }
}

impl ServiceGenerator for ServiceGen {
    fn generate(&mut self, service: Service, buf: &mut String) {
        let full = if service.package.is_empty() {
            service.proto_name.clone()
        } else {
            format!("{}.{}", service.package, service.proto_name)
        };
        let methods: Vec<M<'_>> = service
            .methods
            .iter()
            .map(|m| M {
                m,
                kind: Kind::of(m),
                path: format!("/{full}/{}", m.proto_name),
                konst: m.proto_name.to_shouty_snake_case(),
                stream_ty: format!("{}Stream", m.proto_name.to_upper_camel_case()),
            })
            .collect();
        let desc_mod = format!("{}_descriptor", module_prefix(&service));
        descriptors(buf, &service, &full, &desc_mod, &methods);
        if self.server {
            server(buf, &service, &full, &desc_mod, &methods);
        }
        if self.client {
            client(buf, &service, &full, &desc_mod, &methods);
        }
    }
}

fn descriptors(buf: &mut String, service: &Service, full: &str, desc_mod: &str, ms: &[M<'_>]) {
    let _ = write!(
        buf,
        r#"
/// Method descriptors of `{full}`: full names, call kinds, codec and message types.
pub mod {desc_mod} {{
    /// The service's full name.
    pub const SERVICE: &str = "{full}";

    /// One method of `{full}`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct MethodDescriptor {{
        /// The method's name as written in the `.proto` file.
        pub name: &'static str,
        /// The full name sent on the wire: `/package.Service/Method`.
        pub path: &'static str,
        /// Unary, server streaming, client streaming or bidirectional.
        pub kind: ::topspin::CallKind,
        /// The payload codec id (`topspin::codec::CODEC_PROTOBUF`).
        pub codec: u8,
        /// Full protobuf name of the request message.
        pub input_type: &'static str,
        /// Full protobuf name of the response message.
        pub output_type: &'static str,
    }}
"#
    );
    for m in ms {
        let _ = write!(
            buf,
            r#"
    /// `{path}` ({desc}).
    pub const {konst}: MethodDescriptor = MethodDescriptor {{
        name: "{name}",
        path: "{path}",
        kind: ::topspin::CallKind::{variant},
        codec: ::topspin::codec::CODEC_PROTOBUF,
        input_type: "{input}",
        output_type: "{output}",
    }};
"#,
            path = m.path,
            desc = m.kind.describe(),
            konst = m.konst,
            name = m.m.proto_name,
            variant = m.kind.variant(),
            input = strip_dot(&m.m.input_proto_type),
            output = strip_dot(&m.m.output_proto_type),
        );
    }
    let list: Vec<&str> = ms.iter().map(|m| m.konst.as_str()).collect();
    let _ = write!(
        buf,
        r#"
    /// Every method, in `.proto` order.
    pub const METHODS: &[MethodDescriptor] = &[{}];
}}
"#,
        list.join(", ")
    );
    let _ = service;
}

fn server(buf: &mut String, service: &Service, full: &str, desc_mod: &str, ms: &[M<'_>]) {
    let name = &service.name;
    buf.push('\n');
    doc(
        buf,
        &service.comments,
        &format!("The server side of `{full}`: implement it and serve it with [`{name}Server`]."),
    );
    let _ = writeln!(
        buf,
        "pub trait {name}: ::core::marker::Send + ::core::marker::Sync + 'static {{"
    );
    for m in ms {
        let input = &m.m.input_type;
        let output = &m.m.output_type;
        if m.kind == Kind::ServerStreaming || m.kind == Kind::Bidirectional {
            let _ = writeln!(
                buf,
                "/// The stream of responses of `{path}`.\n\
                 type {st}: ::futures_core::Stream<Item = ::core::result::Result<{output}, ::topspin::Status>> + ::core::marker::Send + 'static;",
                path = m.path,
                st = m.stream_ty,
            );
        }
        doc(
            buf,
            &m.m.comments,
            &format!("Handles `{}` ({}).", m.path, m.kind.describe()),
        );
        let req = if m.kind == Kind::ClientStreaming || m.kind == Kind::Bidirectional {
            format!("::topspin::Request<::topspin::Streaming<{input}>>")
        } else {
            format!("::topspin::Request<{input}>")
        };
        let resp = if m.kind == Kind::ServerStreaming || m.kind == Kind::Bidirectional {
            format!("Self::{}", m.stream_ty)
        } else {
            output.clone()
        };
        buf.push_str(lint_allows(&m.m.name));
        let _ = writeln!(
            buf,
            "fn {}(&self, request: {req}) -> impl ::core::future::Future<Output = ::core::result::Result<::topspin::Response<{resp}>, ::topspin::Status>> + ::core::marker::Send;",
            m.m.name
        );
    }
    buf.push_str("}\n");

    let _ = write!(
        buf,
        r#"
/// Serves a [`{name}`] implementation: pass it to `topspin::ServerBuilder::add_service`.
pub struct {name}Server<T> {{
    inner: ::std::sync::Arc<T>,
}}

impl<T: {name}> {name}Server<T> {{
    /// Wraps an implementation.
    pub fn new(service: T) -> Self {{
        Self::from_arc(::std::sync::Arc::new(service))
    }}

    /// Wraps a shared implementation.
    pub fn from_arc(service: ::std::sync::Arc<T>) -> Self {{
        Self {{ inner: service }}
    }}
}}

impl<T> ::core::clone::Clone for {name}Server<T> {{
    fn clone(&self) -> Self {{
        Self {{ inner: ::std::sync::Arc::clone(&self.inner) }}
    }}
}}

impl<T> ::core::fmt::Debug for {name}Server<T> {{
    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{
        f.write_str("{name}Server({full})")
    }}
}}

impl<T: {name}> ::topspin::Service for {name}Server<T> {{
    fn register(self, builder: ::topspin::ServerBuilder) -> ::topspin::ServerBuilder {{
"#
    );
    if ms.is_empty() {
        buf.push_str("let _ = self;\nbuilder\n}\n}\n");
        return;
    }
    buf.push_str("let service = self.inner;\n");
    for m in ms {
        let input = &m.m.input_type;
        let output = &m.m.output_type;
        let req = if m.kind == Kind::ClientStreaming || m.kind == Kind::Bidirectional {
            format!("::topspin::Request<::topspin::Streaming<{input}>>")
        } else {
            format!("::topspin::Request<{input}>")
        };
        let _ = write!(
            buf,
            r#"
let builder = {{
    let service = ::std::sync::Arc::clone(&service);
    builder.{f}(
        {desc_mod}::{konst}.path,
        ::topspin::codec::ProstCodec::<{output}, {input}>::default(),
        move |request: {req}| {{
            let service = ::std::sync::Arc::clone(&service);
            async move {{ service.{method}(request).await }}
        }},
    )
}};
"#,
            f = m.kind.builder_fn(),
            konst = m.konst,
            method = m.m.name,
        );
    }
    buf.push_str("builder\n}\n}\n");
}

fn client(buf: &mut String, service: &Service, full: &str, desc_mod: &str, ms: &[M<'_>]) {
    let name = &service.name;
    let taken = |n: &str| ms.iter().any(|m| m.m.name == n);
    buf.push('\n');
    doc(
        buf,
        &service.comments,
        &format!(
            "A typed client of `{full}` over a `topspin::Channel` (cheap to clone; clones share the connection)."
        ),
    );
    let _ = write!(
        buf,
        r#"#[derive(Clone, Debug)]
pub struct {name}Client {{
    channel: ::topspin::Channel,
}}

impl ::core::convert::From<::topspin::Channel> for {name}Client {{
    fn from(channel: ::topspin::Channel) -> Self {{
        Self {{ channel }}
    }}
}}

impl {name}Client {{
"#
    );
    if !taken("new") {
        buf.push_str(
            "/// A client calling over `channel`.\n\
             pub fn new(channel: ::topspin::Channel) -> Self {\n Self { channel }\n}\n",
        );
    }
    if !taken("connect") {
        buf.push_str(
            "/// Connects to `address` (`tcp://host:port`, `unix:///path`) with default settings.\n\
             pub async fn connect(address: impl ::topspin::IntoAddress) -> ::core::result::Result<Self, ::topspin::Status> {\n\
             ::core::result::Result::Ok(Self { channel: ::topspin::Channel::connect(address).await? })\n}\n",
        );
    }
    if !taken("channel") {
        buf.push_str(
            "/// The channel calls go over.\n\
             pub fn channel(&self) -> &::topspin::Channel {\n&self.channel\n}\n",
        );
    }
    for m in ms {
        let input = &m.m.input_type;
        let output = &m.m.output_type;
        buf.push('\n');
        doc(
            buf,
            &m.m.comments,
            &format!("Calls `{}` ({}).", m.path, m.kind.describe()),
        );
        let codec = format!("::topspin::codec::ProstCodec::<{input}, {output}>::default()");
        let (generics, req, resp, call) = match m.kind {
            Kind::Unary => (
                String::new(),
                format!("impl ::topspin::IntoRequest<{input}>"),
                output.clone(),
                "unary",
            ),
            Kind::ServerStreaming => (
                String::new(),
                format!("impl ::topspin::IntoRequest<{input}>"),
                format!("::topspin::Streaming<{output}>"),
                "server_streaming",
            ),
            // A bare stream of requests, or a `Request` around one.
            Kind::ClientStreaming => (
                String::new(),
                format!("impl ::topspin::IntoStreamingRequest<Message = {input}>"),
                output.clone(),
                "client_streaming",
            ),
            Kind::Bidirectional => (
                String::new(),
                format!("impl ::topspin::IntoStreamingRequest<Message = {input}>"),
                format!("::topspin::Streaming<{output}>"),
                "streaming",
            ),
        };
        buf.push_str(lint_allows(&m.m.name));
        let _ = write!(
            buf,
            r#"pub async fn {method}{generics}(&self, request: {req}) -> ::core::result::Result<::topspin::Response<{resp}>, ::topspin::Status> {{
    self.channel.{call}({codec}, {desc_mod}::{konst}.path, request).await
}}
"#,
            method = m.m.name,
            konst = m.konst,
        );
    }
    buf.push_str("}\n");
}
