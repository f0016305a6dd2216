//! Peer `thrift`: Apache Thrift 0.17 (the Rust crate matching Debian's thrift-compiler),
//! framed transport, binary protocol, blocking. The server is one thread per connection running
//! the generated processor, as thrift's `TServer` does (its own accept loop here only so that
//! accepted sockets get TCP_NODELAY, which `TServer::listen` does not set); the client is the
//! generated sync client on the main thread. A blocking client has one call in flight per
//! connection, so `throughput` and `burst` are not applicable (reported as "—").

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use thrift::protocol::{TBinaryInputProtocol, TBinaryOutputProtocol};
use thrift::server::TProcessor;
use thrift::transport::{
    ReadHalf, TFramedReadTransport, TFramedWriteTransport, TIoChannel, TTcpChannel, WriteHalf,
};
use thrift::OrderedFloat;
use topspin_bench_common::{
    self as common, check_array, check_blob, check_echo, check_eq, pb, Cmd, Input, Outcome,
    SyncCall,
};

#[allow(
    clippy::all,
    dead_code,
    unused_imports,
    unused_extern_crates,
    non_camel_case_types
)]
mod gen {
    include!(concat!(env!("OUT_DIR"), "/bench.rs"));
}
use gen::{BenchSyncClient, BenchSyncHandler, BenchSyncProcessor, TBenchSyncClient};

struct Svc;

impl BenchSyncHandler for Svc {
    fn handle_echo(&self, data: Vec<u8>) -> thrift::Result<Vec<u8>> {
        Ok(data)
    }
    fn handle_get_answer(&self, n: i32) -> thrift::Result<i32> {
        Ok(41 + n)
    }
    fn handle_get_blob(&self, size: i32) -> thrift::Result<Vec<u8>> {
        let size = (size.max(0) as usize).min(common::BLOB_POOL);
        Ok(common::blob_pool()[..size].to_vec())
    }
    fn handle_get_structs(&self) -> thrift::Result<Vec<gen::Student>> {
        Ok(native_students().clone())
    }
    fn handle_nymph_uint32(&self, value: i32) -> thrift::Result<i32> {
        Ok(value)
    }
    fn handle_nymph_double(&self, value: OrderedFloat<f64>) -> thrift::Result<OrderedFloat<f64>> {
        Ok(value)
    }
    fn handle_nymph_array(&self, values: Vec<i32>) -> thrift::Result<Vec<i32>> {
        Ok(values)
    }
    fn handle_nymph_blob(&self, data: Vec<u8>) -> thrift::Result<Vec<u8>> {
        Ok(data)
    }
}

fn address(a: &pb::Address) -> gen::Address {
    gen::Address {
        city: a.city.clone(),
        zipcode: a.zipcode,
        street: a.street.clone(),
        number: a.number as i16,
    }
}

fn date(d: &pb::Date) -> gen::Date {
    gen::Date {
        year: d.year,
        month: d.month as i8,
        day: d.day as i8,
    }
}

/// The students as Thrift's generated (native) structs, built once.
fn native_students() -> &'static Vec<gen::Student> {
    static S: std::sync::OnceLock<Vec<gen::Student>> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        common::students()
            .iter()
            .map(|s| gen::Student {
                name: s.name.clone(),
                friends: s.friends,
                home_address: address(s.home_address.as_ref().unwrap()),
                birth_place: address(s.birth_place.as_ref().unwrap()),
                birth: date(s.birth.as_ref().unwrap()),
                favorite_subjects: s
                    .favorite_subjects
                    .iter()
                    .map(|x| gen::Subject {
                        id: x.id,
                        title: x.title.clone(),
                        code: x.code.clone(),
                    })
                    .collect(),
                email_addresses: s.email_addresses.clone(),
                schools: s
                    .schools
                    .iter()
                    .map(|x| gen::School {
                        name: x.name.clone(),
                        address: address(x.address.as_ref().unwrap()),
                        foundation: date(x.foundation.as_ref().unwrap()),
                        email_addresses: x.email_addresses.clone(),
                    })
                    .collect(),
            })
            .collect()
    })
}

type Client = BenchSyncClient<
    TBinaryInputProtocol<TFramedReadTransport<ReadHalf<TTcpChannel>>>,
    TBinaryOutputProtocol<TFramedWriteTransport<WriteHalf<TTcpChannel>>>,
>;

struct C(Client);

fn te(e: thrift::Error) -> String {
    e.to_string()
}

impl SyncCall for C {
    fn call(&mut self, input: &Input, check: bool) -> Result<(), String> {
        let c = &mut self.0;
        match input {
            Input::Echo(b) => {
                let r = c.echo(b.to_vec()).map_err(te)?;
                check_echo(&r, b, check)
            }
            Input::Answer(n) => check_eq("answer", c.get_answer(*n).map_err(te)?, 41 + n),
            Input::Blob(size) => {
                let r = c.get_blob(*size as i32).map_err(te)?;
                check_blob(&r, *size, check)
            }
            Input::Structs => {
                let s = c.get_structs().map_err(te)?;
                if check {
                    // The reply is already native structs; compare them with the source data.
                    check_eq("structs", &s, native_students())
                } else {
                    check_eq("structs", s.len(), common::K)
                }
            }
            Input::U32(v) => {
                let r = c.nymph_uint32(*v as i32).map_err(te)?;
                check_eq("nymph_uint32", r as u32, *v)
            }
            Input::F64(v) => {
                let r = c.nymph_double(OrderedFloat(*v)).map_err(te)?;
                check_eq("nymph_double", r.0, *v)
            }
            Input::Array(vals) => {
                let r = c
                    .nymph_array(vals.iter().map(|v| *v as i32).collect())
                    .map_err(te)?;
                let back: Vec<u32> = r.into_iter().map(|v| v as u32).collect();
                check_array(&back, vals)
            }
            Input::NBlob(b) => {
                let r = c.nymph_blob(b.to_vec()).map_err(te)?;
                check_echo(&r, b, check)
            }
        }
    }
}

fn run(c: &mut C, cmd: &Cmd) -> Outcome {
    match cmd.workload.as_str() {
        "throughput" | "burst" => Outcome::unsupported(),
        _ => common::run_sync(c, cmd),
    }
}

/// Apache Thrift, framed transport, binary protocol (peer `thrift`). A topspin-bench peer: started
/// by topspin-bench, it prints `ready NAME`, then answers one JSON command per line of stdin until
/// `quit`.
#[derive(clap::Parser, Debug)]
struct Cli {
    #[command(flatten)]
    placement: common::placement::Placement,
}

fn main() {
    common::placement::init(<Cli as clap::Parser>::parse().placement);
    common::blob_pool();
    native_students();
    // The server: its threads in this process, or a child process of its own
    // (`--separate-processes`, see common::placement).
    let addr: std::net::SocketAddr = match common::placement::separate_server() {
        Some(a) => a.parse().expect("server address"),
        None => {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let addr = l.local_addr().expect("addr");
            let processor = Arc::new(BenchSyncProcessor::new(Svc));
            std::thread::spawn(move || {
                for s in l.incoming().flatten() {
                    s.set_nodelay(true).expect("nodelay");
                    let (r, w) = TTcpChannel::with_stream(s).split().expect("split");
                    let mut ip = TBinaryInputProtocol::new(TFramedReadTransport::new(r), true);
                    let mut op = TBinaryOutputProtocol::new(TFramedWriteTransport::new(w), true);
                    let p = processor.clone();
                    std::thread::spawn(move || while p.process(&mut ip, &mut op).is_ok() {});
                }
            });
            common::placement::server_only(&addr.to_string());
            addr
        }
    };
    let s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let (r, w) = TTcpChannel::with_stream(s).split().expect("split");
    let mut client = C(BenchSyncClient::new(
        TBinaryInputProtocol::new(TFramedReadTransport::new(r), true),
        TBinaryOutputProtocol::new(TFramedWriteTransport::new(w), true),
    ));
    common::serve_commands("thrift", |cmd| run(&mut client, cmd));
}
