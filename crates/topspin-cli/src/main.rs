//! `topspin`: list, describe and call the methods of any topspin server from the terminal, with
//! JSON (like grpcurl for gRPC). Descriptors come from server reflection or from `.proto` files.
#![forbid(unsafe_code)]

mod call;
mod health;
mod protofmt;
mod schema;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Parser, Subcommand};
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use topspin::tls::ClientTls;
use topspin::{Channel, Endpoint, Status};

const AFTER_HELP: &str = "\
Addresses are tcp://host:port (or just host:port) and unix:///path.

Examples:
  topspin list localhost:50051
  topspin describe localhost:50051 kv.v1.Store
  topspin describe localhost:50051               # every service
  topspin call localhost:50051 kv.v1.Store/Put -d '{\"key\": \"a\", \"value\": \"1\"}'
  echo '{\"key\": \"a\"}' | topspin call localhost:50051 kv.v1.Store/Get -d @-
  topspin call localhost:50051 kv.v1.Store/Watch -d '{\"prefix\": \"user/\"}'
  topspin call --proto kv/v1/kv.proto -I proto localhost:50051 kv.v1.Store/Get -d '{\"key\": \"a\"}'
  topspin health localhost:50051 kv.v1.Store

Exit status: 0 on success; 1 for a local problem (bad JSON, unknown method, unreadable
.proto); 2 for bad usage; 64 + the status code when the server answers with an error
(e.g. 69 NOT_FOUND, 68 DEADLINE_EXCEEDED, 78 UNAVAILABLE). `topspin health` has its own
(see topspin health --help).";

const HEALTH_AFTER_HELP: &str = "\
Prints the status (SERVING, NOT_SERVING, UNKNOWN; with --watch also SERVICE_UNKNOWN), one per
line. Without --timeout a check gives up after 10 s; a watch runs until the server ends it (a
graceful shutdown does, after NOT_SERVING) or --timeout.

Exit status:
  0  SERVING
  1  NOT_SERVING or UNKNOWN
  2  the service is unknown (NOT_FOUND; SERVICE_UNKNOWN at the end of a watch), or the server
     has no health service (UNIMPLEMENTED); clap also uses 2 for bad usage
  3  the server could not be reached: refused, not a topspin server, connection lost
     (UNAVAILABLE)
  4  no answer in time (DEADLINE_EXCEEDED, --timeout)
  5  any other error

Examples:
  topspin health localhost:50051                 # the server as a whole
  topspin health localhost:50051 kv.v1.Store
  topspin health --watch unix:///run/kv.sock kv.v1.Store";

/// Call any topspin server from the terminal: list its services, describe them as .proto
/// text, and call its methods with JSON.
///
/// Descriptors come from the server's reflection service (topspin.reflection.v1) or, with
/// --proto, from .proto files.
#[derive(Debug, Parser)]
#[command(name = "topspin", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    schema: SchemaArgs,
}

#[derive(Debug, Args)]
struct SchemaArgs {
    /// Read the API from this .proto file instead of server reflection (repeatable).
    #[arg(long = "proto", value_name = "FILE", global = true)]
    protos: Vec<PathBuf>,
    /// Directory to resolve --proto files and their imports against, as protoc does
    /// (repeatable; default: each --proto file's directory).
    #[arg(short = 'I', long = "import-path", value_name = "DIR", global = true)]
    includes: Vec<PathBuf>,
    /// Give up after this long, e.g. 500ms, 5s, 1m (sent to the server as the call's deadline).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, global = true)]
    timeout: Option<Duration>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// How to connect over TLS (tls:// and wss:// addresses use TLS without --tls).
#[derive(Debug, Args)]
struct TlsArgs {
    /// Connect with TLS: a host:port or tcp:// address becomes tls://.
    #[arg(long, global = true)]
    tls: bool,
    /// Trust only this CA certificate (PEM) instead of the webpki roots.
    #[arg(long, value_name = "FILE", global = true)]
    ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS; needs --key.
    #[arg(long, value_name = "FILE", global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, value_name = "FILE", global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// Check the server's certificate against this name instead of the address's host.
    #[arg(long, value_name = "NAME", global = true)]
    server_name: Option<String>,
}

impl TlsArgs {
    /// The address to connect to (tls:// with --tls) and the endpoint's TLS settings.
    fn apply(&self, address: &str) -> anyhow::Result<Endpoint> {
        let mut address = address.to_owned();
        if self.tls {
            let bare = address.strip_prefix("tcp://").unwrap_or(&address);
            if !bare.contains("://") {
                address = format!("tls://{bare}");
            }
        }
        let endpoint = Endpoint::new(address.as_str()).map_err(|s| anyhow!("{}", s.message()))?;
        let any = self.ca.is_some() || self.cert.is_some() || self.server_name.is_some();
        if !any {
            return Ok(endpoint);
        }
        let mut tls = match &self.ca {
            Some(ca) => ClientTls::ca_pem_file(ca)?,
            None => ClientTls::webpki_roots(),
        };
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity_pem_files(cert, key)?;
        }
        if let Some(name) = &self.server_name {
            tls = tls.server_name(name)?;
        }
        Ok(endpoint.tls(tls))
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List the services and their methods.
    ///
    /// ADDR may be left out with --proto.
    List {
        /// The server, e.g. localhost:50051 or unix:///run/kv.sock.
        #[arg(value_name = "ADDR")]
        address: Option<String>,
    },
    /// Print a service, method, message or enum as .proto text; without NAME, every service.
    ///
    /// NAME is a full name: kv.v1.Store, kv.v1.Store/Get, kv.v1.Entry. ADDR may be left out
    /// with --proto. A lone argument with a ':' is an ADDR, otherwise a NAME.
    #[command(override_usage = "topspin describe [OPTIONS] [ADDR] [NAME]")]
    Describe {
        /// The server's address (optional with --proto), then the full NAME to describe.
        #[arg(value_name = "ADDR NAME", num_args = 0..=2)]
        targets: Vec<String>,
    },
    /// Call a method with JSON; print the response(s) as JSON.
    ///
    /// A single response is printed pretty; a response stream as one JSON object per line.
    /// A request stream is read from -d (one JSON value after another) or, without -d or with
    /// -d @-, from stdin as JSON lines, sent as they are read.
    Call {
        /// The server, e.g. localhost:50051 or unix:///run/kv.sock.
        #[arg(value_name = "ADDR")]
        address: String,
        /// The method: package.Service/Method.
        #[arg(value_name = "METHOD")]
        method: String,
        /// The request as JSON, @FILE to read it from a file, or @- for stdin. Default: {}
        /// (or, for a request stream, JSON lines from stdin).
        #[arg(short = 'd', long = "data", value_name = "JSON")]
        data: Option<String>,
        /// Request metadata, key:value (repeatable). Keys are lower-cased; the values of keys
        /// ending in -bin are base64 (standard or URL-safe, padded or not), as with grpcurl.
        #[arg(short = 'H', long = "header", value_name = "KEY:VALUE")]
        headers: Vec<String>,
        /// Print fields that hold their default value too.
        #[arg(long)]
        emit_defaults: bool,
        /// Print field names as in the .proto file instead of lowerCamelCase JSON names.
        #[arg(long)]
        proto_names: bool,
        /// Print response metadata and trailers on stderr.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Ask the server's health service (grpc.health.v1.Health) whether it, or a service, is
    /// serving.
    #[command(after_help = HEALTH_AFTER_HELP)]
    Health {
        /// The server, e.g. localhost:50051 or unix:///run/kv.sock.
        #[arg(value_name = "ADDR")]
        address: String,
        /// The service's full name, e.g. kv.v1.Store (default: the server as a whole).
        #[arg(value_name = "SERVICE")]
        service: Option<String>,
        /// Print the status, then every change, until the server ends the stream.
        #[arg(long)]
        watch: bool,
    },
}

impl Command {
    /// The server's address, if the command names one.
    fn address(&self) -> Option<&str> {
        match self {
            Command::List { address } => address.as_deref(),
            Command::Describe { targets } => describe_targets(targets).0,
            Command::Call { address, .. } | Command::Health { address, .. } => Some(address),
        }
    }
}

/// `describe`'s arguments: the address, the name.
fn describe_targets(targets: &[String]) -> (Option<&str>, Option<&str>) {
    match targets {
        [] => (None, None),
        // Full names never hold a ':'; addresses do (host:port, unix:///path).
        [one] if one.contains(':') => (Some(one), None),
        [name] => (None, Some(name)),
        [address, name, ..] => (Some(address), Some(name)),
    }
}

/// `topspin health` failed: the error, and the exit status it calls for.
#[derive(Debug)]
struct HealthFailed(anyhow::Error, u8);

impl fmt::Display for HealthFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for HealthFailed {}

/// An error status from the server.
#[derive(Debug)]
pub(crate) struct CallFailed(pub(crate) Status);

impl fmt::Display for CallFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (code {}): {}",
            self.0.code().name(),
            self.0.code().as_u16(),
            self.0.message()
        )
    }
}

impl std::error::Error for CallFailed {}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 5s or 1m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

fn channel(address: &str, args: &SchemaArgs) -> anyhow::Result<Channel> {
    let mut endpoint = args.tls.apply(address)?;
    if let Some(t) = args.timeout {
        endpoint = endpoint.timeout(t);
    }
    Ok(endpoint.connect_lazy())
}

async fn schema_for(args: &SchemaArgs, address: Option<&str>) -> anyhow::Result<schema::Schema> {
    if !args.protos.is_empty() {
        return Ok(schema::Schema::Files(schema::compile_files(
            &args.protos,
            &args.includes,
        )?));
    }
    let Some(address) = address else {
        bail!("give the server's ADDR, or .proto files with --proto");
    };
    Ok(schema::Schema::reflection(
        channel(address, args)?,
        args.timeout,
    ))
}

/// Runs the command; the exit status when it succeeds.
async fn run(cli: Cli) -> anyhow::Result<u8> {
    let args = &cli.schema;
    match &cli.command {
        Command::List { address } => {
            let schema = schema_for(args, address.as_deref()).await?;
            let mut out = String::new();
            for s in schema.services().await? {
                out.push_str(&s.name);
                out.push('\n');
                for m in &s.methods {
                    out.push_str(&format!(
                        "  {}({}{}) returns ({}{})\n",
                        m.name,
                        if m.client_streaming { "stream " } else { "" },
                        m.input_type,
                        if m.server_streaming { "stream " } else { "" },
                        m.output_type
                    ));
                }
            }
            print!("{out}");
            Ok(0)
        }
        Command::Describe { targets } => {
            let (address, name) = describe_targets(targets);
            let schema = schema_for(args, address).await?;
            match name {
                Some(name) => print!("{}", describe(&schema, name).await?),
                None => print!("{}", describe_all(&schema).await?),
            }
            Ok(0)
        }
        Command::Call {
            address,
            method,
            data,
            headers,
            emit_defaults,
            proto_names,
            verbose,
        } => {
            let metadata = call::metadata(headers)?;
            let input = call::Input::parse(data.as_deref());
            let channel = channel(address, args)?;
            let schema = if args.protos.is_empty() {
                schema::Schema::reflection(channel.clone(), args.timeout)
            } else {
                schema::Schema::Files(schema::compile_files(&args.protos, &args.includes)?)
            };
            let method = schema.method(method).await?;
            let output = call::Output {
                emit_defaults: *emit_defaults,
                proto_names: *proto_names,
                verbose: *verbose,
            };
            call::call(&channel, &method, &input, metadata, args.timeout, &output).await?;
            Ok(0)
        }
        Command::Health {
            address,
            service,
            watch,
        } => {
            let channel = channel(address, args).map_err(|e| HealthFailed(e, health::OTHER))?;
            let service = service.as_deref().unwrap_or("");
            let result = if *watch {
                health::watch(channel, service, args.timeout).await
            } else {
                health::check(channel, service, args.timeout).await
            };
            result.map_err(|(e, code)| HealthFailed(e, code).into())
        }
    }
}

/// Every service, as `.proto` text, one after the other.
async fn describe_all(schema: &schema::Schema) -> anyhow::Result<String> {
    let mut out = String::new();
    for info in schema.services().await? {
        let pool = schema.pool_for(&info.name).await?;
        if let Some(s) = pool.and_then(|p| p.get_service_by_name(&info.name)) {
            if !out.is_empty() {
                out.push('\n');
            }
            protofmt::service(&s, &mut out);
        }
    }
    Ok(out)
}

/// The protocol a peer that does not speak topspin seems to speak, from the bytes it sent
/// instead of a topspin preface (which the connect error quotes: `got [00, 00, ...]`).
fn foreign_protocol(e: &anyhow::Error) -> Option<(&'static str, String)> {
    let e = e.downcast_ref::<HealthFailed>().map_or(e, |h| &h.0);
    let message = e
        .chain()
        .find_map(|c| c.downcast_ref::<CallFailed>())?
        .0
        .message();
    let start = message.find("preface (got [")? + "preface (got [".len();
    let end = start + message[start..].find(']')?;
    let bytes: Vec<u8> = message[start..end]
        .split(", ")
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    let hex = message[start..end].replace(',', "");
    let protocol = match bytes.as_slice() {
        // An HTTP/2 frame header: 24-bit length, then type 4 (SETTINGS), flags 0 or 1 (ACK),
        // stream 0 — the first thing an HTTP/2 server sends.
        [l0, l1, l2, 4, flags, 0, 0, 0, ..]
            if *flags <= 1 && u32::from_be_bytes([0, *l0, *l1, *l2]) % 6 == 0 =>
        {
            "HTTP/2 (gRPC?)"
        }
        [b'P', b'R', b'I', b' ', b'*', ..] => "HTTP/2 (gRPC?)",
        [b'H', b'T', b'T', b'P', b'/', b'1', ..] => "HTTP/1",
        _ => return None,
    };
    Some((protocol, hex))
}

/// `.proto` text for a service, method, message or enum.
async fn describe(schema: &schema::Schema, name: &str) -> anyhow::Result<String> {
    let name = name.trim_start_matches(['.', '/']);
    let dotted = name.replace('/', ".");
    let mut out = String::new();
    if let Some(pool) = schema.pool_for(&dotted).await? {
        if let Some(s) = pool.get_service_by_name(&dotted) {
            protofmt::service(&s, &mut out);
            return Ok(out);
        }
        if let Some(m) = pool.get_message_by_name(&dotted) {
            protofmt::message(&m, "", &mut out);
            return Ok(out);
        }
        if let Some(e) = pool.get_enum_by_name(&dotted) {
            protofmt::enumeration(&e, "", &mut out);
            return Ok(out);
        }
        if let Some((svc, method)) = dotted.rsplit_once('.') {
            if let Some(m) = pool
                .get_service_by_name(svc)
                .and_then(|s| s.methods().find(|m| m.name() == method))
            {
                protofmt::method(&m, "", &mut out);
                return Ok(out);
            }
        }
    }
    let services = schema.services().await?;
    let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
    bail!(
        "nothing is named {name:?}; the services are:\n  {}",
        names.join("\n  ")
    )
}

fn main() -> ExitCode {
    let mut cli = Cli::parse();
    if let Command::Health { watch: false, .. } = cli.command {
        // A probe must not hang: a single check gives up after 10 s unless told otherwise.
        cli.schema.timeout.get_or_insert(Duration::from_secs(10));
    }
    let address = cli.command.address().map(str::to_owned);
    let timeout = cli.schema.timeout;
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the runtime")
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("topspin: error: {e:#}");
            return ExitCode::from(1);
        }
    };
    let is_health = matches!(cli.command, Command::Health { .. });
    let result = runtime.block_on(async {
        match timeout {
            // A little longer than the call's own deadline, so the server's answer wins.
            Some(t) => tokio::time::timeout(t + Duration::from_millis(200), run(cli))
                .await
                .unwrap_or_else(|_| {
                    Err(
                        CallFailed(Status::deadline_exceeded(format!("no answer within {t:?}")))
                            .into(),
                    )
                }),
            None => run(cli).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader of stdout went away (`topspin call ... | head -1`): not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            match (foreign_protocol(&e), &address) {
                (Some((protocol, got)), Some(address)) => eprintln!(
                    "topspin: error: the server at {address} speaks {protocol}, not topspin (it \
                     answered {got})"
                ),
                _ => eprintln!("topspin: error: {e:#}"),
            }
            if let Some(HealthFailed(_, code)) = e.downcast_ref::<HealthFailed>() {
                return ExitCode::from(*code);
            }
            if is_health {
                return ExitCode::from(health::exit_status_of(&e));
            }
            match e.chain().find_map(|c| c.downcast_ref::<CallFailed>()) {
                Some(CallFailed(s)) => ExitCode::from(64 + s.code().as_u16() as u8),
                None => ExitCode::from(1),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn arguments_parse() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "topspin",
            "call",
            "localhost:1",
            "a.B/C",
            "-d",
            "@-",
            "-H",
            "k:v",
            "--timeout",
            "1s",
        ])
        .unwrap();
        assert_eq!(cli.schema.timeout, Some(Duration::from_secs(1)));
        let described = |args: &[&str]| {
            let mut argv = vec!["topspin", "describe"];
            argv.extend(args);
            match Cli::try_parse_from(argv).unwrap().command {
                Command::Describe { targets } => describe_targets(&targets)
                    .0
                    .map(str::to_owned)
                    .into_iter()
                    .chain(describe_targets(&targets).1.map(str::to_owned))
                    .collect::<Vec<_>>(),
                _ => unreachable!(),
            }
        };
        assert_eq!(described(&["h:1"]), ["h:1"]);
        assert_eq!(described(&["h:1", "a.B"]), ["h:1", "a.B"]);
        assert_eq!(described(&["a.B"]), ["a.B"]);
        assert!(described(&[]).is_empty());
        assert!(Cli::try_parse_from(["topspin", "describe", "a", "b", "c"]).is_err());
    }

    #[test]
    fn foreign_protocols_are_recognised_from_the_bytes_they_sent() {
        let seen = |got: &str| {
            let e = anyhow::Error::new(CallFailed(Status::unavailable(format!(
                "could not connect: the server does not speak the topspin protocol (BAD_PREFACE: \
                 connection does not start with the topspin preface (got [{got}]); is the peer \
                 speaking another protocol?)"
            ))));
            foreign_protocol(&e.context("the reflection call failed")).map(|(p, _)| p)
        };
        // grpc-go's and hyper's first frame: SETTINGS with 3 settings (18 bytes).
        assert_eq!(
            seen("00, 00, 12, 04, 00, 00, 00, 00"),
            Some("HTTP/2 (gRPC?)")
        );
        assert_eq!(
            seen("00, 00, 00, 04, 01, 00, 00, 00"),
            Some("HTTP/2 (gRPC?)")
        );
        assert_eq!(seen("48, 54, 54, 50, 2f, 31, 2e, 31"), Some("HTTP/1"));
        // A DATA frame, a SETTINGS length that is not a multiple of 6, garbage: not named.
        assert_eq!(seen("00, 00, 12, 00, 00, 00, 00, 01"), None);
        assert_eq!(seen("00, 00, 07, 04, 00, 00, 00, 00"), None);
        assert_eq!(seen("de, ad, be, ef, 00, 00, 00, 00"), None);
    }

    #[test]
    fn call_failed_names_the_code() {
        let e = CallFailed(Status::not_found("no key"));
        assert_eq!(e.to_string(), "NOT_FOUND (code 5): no key");
    }
}
