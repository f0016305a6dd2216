//! Peer `tarpc`: tarpc 0.38 with its serde transport and bincode over TCP, TCP_NODELAY on both
//! sides, default client and server configs. The server runs on its own tokio multi-thread
//! runtime (default worker count), each request spawned as tarpc's examples do; the client on a
//! current-thread runtime on the main thread. Non-default: the length-delimited codec's frame
//! limit is raised from 8 MiB to 64 MiB so that the 16 MiB workloads fit.

use bytes::Bytes;
use futures_util::StreamExt;
use std::net::SocketAddr;
use tarpc::context;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tarpc::tokio_util::codec::{Framed, LengthDelimitedCodec};
use tokio::net::{TcpListener, TcpStream};
use topspin_bench_common::{
    self as common, check_array, check_blob, check_echo, check_eq, pb, AsyncCall, Input,
};

#[tarpc::service]
trait Bench {
    async fn echo(data: Bytes) -> Bytes;
    async fn get_answer(n: i32) -> i32;
    async fn get_blob(size: u32) -> Bytes;
    async fn get_structs() -> Vec<pb::Student>;
    async fn nymph_uint32(v: u32) -> u32;
    async fn nymph_double(v: f64) -> f64;
    async fn nymph_array(v: Vec<u32>) -> Vec<u32>;
    async fn nymph_blob(v: Bytes) -> Bytes;
}

#[derive(Clone)]
struct Svc;

impl Bench for Svc {
    async fn echo(self, _: context::Context, data: Bytes) -> Bytes {
        data
    }
    async fn get_answer(self, _: context::Context, n: i32) -> i32 {
        41 + n
    }
    async fn get_blob(self, _: context::Context, size: u32) -> Bytes {
        common::blob_pool().slice(0..(size as usize).min(common::BLOB_POOL))
    }
    async fn get_structs(self, _: context::Context) -> Vec<pb::Student> {
        common::students().to_vec()
    }
    async fn nymph_uint32(self, _: context::Context, v: u32) -> u32 {
        v
    }
    async fn nymph_double(self, _: context::Context, v: f64) -> f64 {
        v
    }
    async fn nymph_array(self, _: context::Context, v: Vec<u32>) -> Vec<u32> {
        v
    }
    async fn nymph_blob(self, _: context::Context, v: Bytes) -> Bytes {
        v
    }
}

const MAX_FRAME: usize = 64 << 20;

fn framed(s: TcpStream) -> Framed<TcpStream, LengthDelimitedCodec> {
    s.set_nodelay(true).expect("nodelay");
    Framed::new(
        s,
        LengthDelimitedCodec::builder()
            .max_frame_length(MAX_FRAME)
            .new_codec(),
    )
}

struct Client(BenchClient);

fn rpc(e: tarpc::client::RpcError) -> String {
    e.to_string()
}

impl AsyncCall for Client {
    async fn call(&self, input: &Input, check: bool) -> Result<(), String> {
        let c = &self.0;
        let cx = context::current();
        match input {
            Input::Echo(b) => {
                let r = c.echo(cx, b.clone()).await.map_err(rpc)?;
                check_echo(&r, b, check)
            }
            Input::Answer(n) => {
                let r = c.get_answer(cx, *n).await.map_err(rpc)?;
                check_eq("answer", r, 41 + n)
            }
            Input::Blob(size) => {
                let r = c.get_blob(cx, *size).await.map_err(rpc)?;
                check_blob(&r, *size, check)
            }
            Input::Structs => {
                let s = c.get_structs(cx).await.map_err(rpc)?;
                if check {
                    common::check_students(&s)
                } else {
                    check_eq("structs", s.len(), common::K)
                }
            }
            Input::U32(v) => {
                let r = c.nymph_uint32(cx, *v).await.map_err(rpc)?;
                check_eq("nymph_uint32", r, *v)
            }
            Input::F64(v) => {
                let r = c.nymph_double(cx, *v).await.map_err(rpc)?;
                check_eq("nymph_double", r, *v)
            }
            Input::Array(vals) => {
                let r = c.nymph_array(cx, vals.clone()).await.map_err(rpc)?;
                check_array(&r, vals)
            }
            Input::NBlob(b) => {
                let r = c.nymph_blob(cx, b.clone()).await.map_err(rpc)?;
                check_echo(&r, b, check)
            }
        }
    }
}

const CONNS: usize = 4;

/// tarpc with its bincode serde transport over TCP (peer `tarpc`). A topspin-bench peer: started by
/// topspin-bench, it prints `ready NAME`, then answers one JSON command per line of stdin until
/// `quit`.
#[derive(clap::Parser, Debug)]
struct Cli {
    #[command(flatten)]
    placement: common::placement::Placement,
}

fn main() {
    common::placement::init(<Cli as clap::Parser>::parse().placement);
    common::blob_pool();
    common::students();
    // The server: on its own runtime in this process, or a child process of its own
    // (`--separate-processes`, see common::placement).
    let _server_rt;
    let addr: SocketAddr = match common::placement::separate_server() {
        Some(a) => a.parse().expect("server address"),
        None => {
            let server_rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("server runtime");
            let addr = server_rt.block_on(async {
                let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let addr = l.local_addr().expect("addr");
                tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        let transport = tarpc::serde_transport::new(framed(s), Bincode::default());
                        let channel = BaseChannel::with_defaults(transport);
                        tokio::spawn(channel.execute(Svc.serve()).for_each(|fut| async move {
                            tokio::spawn(fut);
                        }));
                    }
                });
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
            let s = TcpStream::connect(addr).await.expect("connect");
            let transport = tarpc::serde_transport::new(framed(s), Bincode::default());
            v.push(Client(
                BenchClient::new(tarpc::client::Config::default(), transport).spawn(),
            ));
        }
        v
    });
    common::serve_commands("tarpc", |cmd| rt.block_on(common::run_async(&clients, cmd)));
}
