//! Peer `tonic`: gRPC over HTTP/2 with tonic 0.14 and prost, default features, TCP_NODELAY on
//! both sides (tonic's server and `Endpoint` option). The server runs on its own tokio
//! multi-thread runtime (default worker count); the client on a current-thread runtime on the
//! main thread. Clients are cloned per call, as tonic's docs recommend.
//!
//! With `--grpc-go-server` it is `grpc-go-server`: this same tonic client calling the grpc-go
//! peer's server (`topspin-bench-grpc-go --server-only`, built beside this program by
//! scripts/bench.sh), a process of its own whose CPU time and allocations count as the
//! server's (common::placement::external_server). So `tonic`, `topspin-grpc` and
//! `grpc-go-server` are three servers under tonic's client.
//!
//! Built by the `topspin-bench-tonic-tls` package (feature `tls`, tonic's `tls-ring`) it is
//! `tonic-tls`: the same over TLS, with a certificate for `localhost` made at start (rcgen).

use std::net::SocketAddr;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};
use topspin_bench_common::{
    self as common, check_array, check_blob, check_echo, check_eq, pb, AsyncCall, Input,
};

mod gen {
    #![allow(clippy::all, missing_docs)]
    include!(concat!(env!("OUT_DIR"), "/bench.v1.rs"));
}
use gen::bench_client::BenchClient;
use gen::bench_server::{Bench, BenchServer};

struct Svc;

#[tonic::async_trait]
impl Bench for Svc {
    async fn echo(&self, r: Request<pb::EchoRequest>) -> Result<Response<pb::EchoReply>, Status> {
        Ok(Response::new(pb::EchoReply {
            data: r.into_inner().data,
        }))
    }
    async fn get_answer(
        &self,
        r: Request<pb::AnswerRequest>,
    ) -> Result<Response<pb::AnswerReply>, Status> {
        Ok(Response::new(pb::AnswerReply {
            answer: 41 + r.get_ref().n,
        }))
    }
    async fn get_blob(
        &self,
        r: Request<pb::BlobRequest>,
    ) -> Result<Response<pb::BlobReply>, Status> {
        let size = r.get_ref().size as usize;
        if size > common::BLOB_POOL {
            return Err(Status::invalid_argument("blob too large"));
        }
        Ok(Response::new(pb::BlobReply {
            data: common::blob_pool().slice(0..size),
        }))
    }
    async fn get_structs(
        &self,
        _r: Request<pb::StructsRequest>,
    ) -> Result<Response<pb::StructsReply>, Status> {
        Ok(Response::new(pb::StructsReply {
            students: common::students().to_vec(),
        }))
    }
    async fn nymph_uint32(
        &self,
        r: Request<pb::Uint32Value>,
    ) -> Result<Response<pb::Uint32Value>, Status> {
        Ok(Response::new(r.into_inner()))
    }
    async fn nymph_double(
        &self,
        r: Request<pb::DoubleValue>,
    ) -> Result<Response<pb::DoubleValue>, Status> {
        Ok(Response::new(r.into_inner()))
    }
    async fn nymph_array(
        &self,
        r: Request<pb::ArrayValue>,
    ) -> Result<Response<pb::ArrayValue>, Status> {
        Ok(Response::new(r.into_inner()))
    }
    async fn nymph_blob(
        &self,
        r: Request<pb::BlobValue>,
    ) -> Result<Response<pb::BlobValue>, Status> {
        Ok(Response::new(r.into_inner()))
    }
}

struct Client(BenchClient<tonic::transport::Channel>);

fn st(s: Status) -> String {
    format!("{:?}: {}", s.code(), s.message())
}

impl AsyncCall for Client {
    async fn call(&self, input: &Input, check: bool) -> Result<(), String> {
        let mut c = self.0.clone();
        match input {
            Input::Echo(b) => {
                let r = c
                    .echo(pb::EchoRequest { data: b.clone() })
                    .await
                    .map_err(st)?;
                check_echo(&r.get_ref().data, b, check)
            }
            Input::Answer(n) => {
                let r = c
                    .get_answer(pb::AnswerRequest { n: *n })
                    .await
                    .map_err(st)?;
                check_eq("answer", r.get_ref().answer, 41 + n)
            }
            Input::Blob(size) => {
                let r = c
                    .get_blob(pb::BlobRequest { size: *size })
                    .await
                    .map_err(st)?;
                check_blob(&r.get_ref().data, *size, check)
            }
            Input::Structs => {
                let r = c.get_structs(pb::StructsRequest {}).await.map_err(st)?;
                let s = &r.get_ref().students;
                if check {
                    common::check_students(s)
                } else {
                    check_eq("structs", s.len(), common::K)
                }
            }
            Input::U32(v) => {
                let r = c
                    .nymph_uint32(pb::Uint32Value { value: *v })
                    .await
                    .map_err(st)?;
                check_eq("nymph_uint32", r.get_ref().value, *v)
            }
            Input::F64(v) => {
                let r = c
                    .nymph_double(pb::DoubleValue { value: *v })
                    .await
                    .map_err(st)?;
                check_eq("nymph_double", r.get_ref().value, *v)
            }
            Input::Array(vals) => {
                let r = c
                    .nymph_array(pb::ArrayValue {
                        values: vals.clone(),
                    })
                    .await
                    .map_err(st)?;
                check_array(&r.get_ref().values, vals)
            }
            Input::NBlob(b) => {
                let r = c
                    .nymph_blob(pb::BlobValue { data: b.clone() })
                    .await
                    .map_err(st)?;
                check_echo(&r.get_ref().data, b, check)
            }
        }
    }
}

const CONNS: usize = 4;
/// 64 MiB, like topspin's default limit: the 16 MiB workloads must fit (tonic's default is 4 MiB
/// for decoding, which would refuse them; this is the one non-default setting).
const MAX_MESSAGE: usize = 64 << 20;

/// A CA and a certificate for `localhost`, PEM: (ca, cert, key).
#[cfg(feature = "tls")]
fn make_pki() -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().expect("key");
    let ca = ca_params.self_signed(&ca_key).expect("CA");
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .expect("params")
        .signed_by(&key, &Issuer::from_params(&ca_params, &ca_key))
        .expect("certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// tonic 0.14 over HTTP/2 (peer `tonic`; the topspin-bench-tonic-tls build: `tonic-tls`, over TLS).
/// A topspin-bench peer: started by topspin-bench, it prints `ready NAME`, then answers one JSON
/// command per line of stdin until `quit`.
#[derive(clap::Parser, Debug)]
struct Cli {
    /// The server is grpc-go's (the grpc-go peer's, `topspin-bench-grpc-go --server-only`,
    /// from this program's directory), in a process of its own (`grpc-go-server`)
    #[arg(long)]
    grpc_go_server: bool,
    #[command(flatten)]
    placement: common::placement::Placement,
}

fn main() {
    let cli = <Cli as clap::Parser>::parse();
    if cfg!(feature = "tls") && cli.grpc_go_server {
        eprintln!("--grpc-go-server is in the topspin-bench-tonic build, not the TLS one");
        std::process::exit(2);
    }
    common::placement::init(cli.placement);
    #[cfg(feature = "tls")]
    let pki = make_pki();
    common::blob_pool();
    common::students();
    // The server: on its own runtime in this process, or a child process of its own
    // (`--separate-processes`, see common::placement).
    let _server_rt;
    let go_server = cli.grpc_go_server.then(|| {
        let go = common::placement::sibling("topspin-bench-grpc-go");
        common::placement::external_server(&go, &["--server-only"])
    });
    let addr: SocketAddr = match go_server.or_else(common::placement::separate_server) {
        Some(a) => a.parse().expect("server address"),
        None => {
            let server_rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("server runtime");
            let addr: SocketAddr = server_rt.block_on(async {
                let incoming = TcpIncoming::bind("127.0.0.1:0".parse().unwrap())
                    .expect("bind")
                    .with_nodelay(Some(true));
                let addr = incoming.local_addr().expect("addr");
                let svc = BenchServer::new(Svc)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE);
                #[allow(unused_mut)]
                let mut server = Server::builder().tcp_nodelay(true);
                #[cfg(feature = "tls")]
                {
                    let id = tonic::transport::Identity::from_pem(&pki.1, &pki.2);
                    server = server
                        .tls_config(tonic::transport::ServerTlsConfig::new().identity(id))
                        .expect("TLS config");
                }
                tokio::spawn(server.add_service(svc).serve_with_incoming(incoming));
                addr
            });
            common::placement::server_only(&addr.to_string());
            _server_rt = server_rt;
            addr
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let clients: Vec<Client> = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..CONNS {
            #[cfg(not(feature = "tls"))]
            let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("endpoint");
            #[cfg(feature = "tls")]
            let endpoint = Endpoint::from_shared(format!("https://{addr}"))
                .expect("endpoint")
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(&pki.0))
                        .domain_name("localhost"),
                )
                .expect("TLS config");
            let ch = endpoint.tcp_nodelay(true).connect().await.expect("connect");
            v.push(Client(
                BenchClient::new(ch)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            ));
        }
        v
    });
    let name = if cfg!(feature = "tls") {
        "tonic-tls"
    } else if cli.grpc_go_server {
        "grpc-go-server"
    } else {
        "tonic"
    };
    common::serve_commands(name, |cmd| rt.block_on(common::run_async(&clients, cmd)));
}
