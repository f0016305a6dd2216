//! Peer `capnp`: capnp-rpc 0.27 (two-party VatNetwork over TCP), set up as its hello-world
//! example does: TCP_NODELAY, futures BufReader/BufWriter around the socket, default reader
//! options. capnp-rpc is single-threaded (`!Send`): the server runs on its own thread (a
//! current-thread tokio runtime and a LocalSet), the client on the main thread (the same).
//! The client decodes `GetStructs` into the native (prost) types, like every other peer.

use capnp_rpc::{rpc_twoparty_capnp, twoparty, RpcSystem};
use futures_util::AsyncReadExt;
use std::net::SocketAddr;
use std::rc::Rc;
use topspin_bench_common::{
    self as common, check_array, check_blob, check_echo, check_eq, pb, AsyncCall, Input,
};

#[allow(clippy::all, dead_code, unused_qualifications)]
mod bench_capnp {
    include!(concat!(env!("OUT_DIR"), "/bench_capnp.rs"));
}
use bench_capnp::{address, bench, date, school, student, subject};

struct Svc;

fn set_address(mut b: address::Builder<'_>, a: &pb::Address) {
    b.set_city(a.city.as_str());
    b.set_zipcode(a.zipcode);
    b.set_street(a.street.as_str());
    b.set_number(a.number as i16);
}

fn set_date(mut b: date::Builder<'_>, d: &pb::Date) {
    b.set_year(d.year);
    b.set_month(d.month as i8);
    b.set_day(d.day as i8);
}

fn set_student(mut b: student::Builder<'_>, s: &pb::Student) {
    b.set_name(s.name.as_str());
    b.set_friends(s.friends);
    if let Some(a) = &s.home_address {
        set_address(b.reborrow().init_home_address(), a);
    }
    if let Some(a) = &s.birth_place {
        set_address(b.reborrow().init_birth_place(), a);
    }
    if let Some(d) = &s.birth {
        set_date(b.reborrow().init_birth(), d);
    }
    {
        let mut l = b
            .reborrow()
            .init_favorite_subjects(s.favorite_subjects.len() as u32);
        for (i, x) in s.favorite_subjects.iter().enumerate() {
            let mut e = l.reborrow().get(i as u32);
            e.set_id(x.id);
            e.set_title(x.title.as_str());
            e.set_code(x.code.as_str());
        }
    }
    {
        let mut l = b
            .reborrow()
            .init_email_addresses(s.email_addresses.len() as u32);
        for (i, x) in s.email_addresses.iter().enumerate() {
            l.set(i as u32, x.as_str());
        }
    }
    let mut l = b.reborrow().init_schools(s.schools.len() as u32);
    for (i, x) in s.schools.iter().enumerate() {
        let mut e = l.reborrow().get(i as u32);
        e.set_name(x.name.as_str());
        if let Some(a) = &x.address {
            set_address(e.reborrow().init_address(), a);
        }
        if let Some(d) = &x.foundation {
            set_date(e.reborrow().init_foundation(), d);
        }
        let mut m = e.init_email_addresses(x.email_addresses.len() as u32);
        for (j, y) in x.email_addresses.iter().enumerate() {
            m.set(j as u32, y.as_str());
        }
    }
}

type R<T> = Result<T, capnp::Error>;

fn text(t: capnp::text::Reader<'_>) -> R<String> {
    Ok(t.to_str()?.to_owned())
}

fn get_address(r: address::Reader<'_>) -> R<pb::Address> {
    Ok(pb::Address {
        city: text(r.get_city()?)?,
        zipcode: r.get_zipcode(),
        street: text(r.get_street()?)?,
        number: r.get_number() as i32,
    })
}

fn get_date(r: date::Reader<'_>) -> pb::Date {
    pb::Date {
        year: r.get_year(),
        month: r.get_month() as i32,
        day: r.get_day() as i32,
    }
}

fn get_subject(r: subject::Reader<'_>) -> R<pb::Subject> {
    Ok(pb::Subject {
        id: r.get_id(),
        title: text(r.get_title()?)?,
        code: text(r.get_code()?)?,
    })
}

fn get_school(r: school::Reader<'_>) -> R<pb::School> {
    Ok(pb::School {
        name: text(r.get_name()?)?,
        address: Some(get_address(r.get_address()?)?),
        foundation: Some(get_date(r.get_foundation()?)),
        email_addresses: r
            .get_email_addresses()?
            .iter()
            .map(|t| text(t?))
            .collect::<R<_>>()?,
    })
}

fn get_student(r: student::Reader<'_>) -> R<pb::Student> {
    Ok(pb::Student {
        name: text(r.get_name()?)?,
        friends: r.get_friends(),
        home_address: Some(get_address(r.get_home_address()?)?),
        birth_place: Some(get_address(r.get_birth_place()?)?),
        birth: Some(get_date(r.get_birth()?)),
        favorite_subjects: r
            .get_favorite_subjects()?
            .iter()
            .map(get_subject)
            .collect::<R<_>>()?,
        email_addresses: r
            .get_email_addresses()?
            .iter()
            .map(|t| text(t?))
            .collect::<R<_>>()?,
        schools: r.get_schools()?.iter().map(get_school).collect::<R<_>>()?,
    })
}

impl bench::Server for Svc {
    async fn echo(self: Rc<Self>, p: bench::EchoParams, mut r: bench::EchoResults) -> R<()> {
        r.get().set_data(p.get()?.get_data()?);
        Ok(())
    }
    async fn get_answer(
        self: Rc<Self>,
        p: bench::GetAnswerParams,
        mut r: bench::GetAnswerResults,
    ) -> R<()> {
        r.get().set_answer(41 + p.get()?.get_n());
        Ok(())
    }
    async fn get_blob(
        self: Rc<Self>,
        p: bench::GetBlobParams,
        mut r: bench::GetBlobResults,
    ) -> R<()> {
        let size = (p.get()?.get_size() as usize).min(common::BLOB_POOL);
        r.get().set_data(&common::blob_pool()[..size]);
        Ok(())
    }
    async fn get_structs(
        self: Rc<Self>,
        _p: bench::GetStructsParams,
        mut r: bench::GetStructsResults,
    ) -> R<()> {
        let students = common::students();
        let mut l = r.get().init_students(students.len() as u32);
        for (i, s) in students.iter().enumerate() {
            set_student(l.reborrow().get(i as u32), s);
        }
        Ok(())
    }
    async fn nymph_uint32(
        self: Rc<Self>,
        p: bench::NymphUint32Params,
        mut r: bench::NymphUint32Results,
    ) -> R<()> {
        r.get().set_value(p.get()?.get_value());
        Ok(())
    }
    async fn nymph_double(
        self: Rc<Self>,
        p: bench::NymphDoubleParams,
        mut r: bench::NymphDoubleResults,
    ) -> R<()> {
        r.get().set_value(p.get()?.get_value());
        Ok(())
    }
    async fn nymph_array(
        self: Rc<Self>,
        p: bench::NymphArrayParams,
        mut r: bench::NymphArrayResults,
    ) -> R<()> {
        r.get().set_values(p.get()?.get_values()?)?;
        Ok(())
    }
    async fn nymph_blob(
        self: Rc<Self>,
        p: bench::NymphBlobParams,
        mut r: bench::NymphBlobResults,
    ) -> R<()> {
        r.get().set_data(p.get()?.get_data()?);
        Ok(())
    }
}

type Reader = futures_util::io::BufReader<
    futures_util::io::ReadHalf<tokio_util::compat::Compat<tokio::net::TcpStream>>,
>;

fn network(
    stream: tokio::net::TcpStream,
    side: rpc_twoparty_capnp::Side,
) -> Box<twoparty::VatNetwork<Reader>> {
    stream.set_nodelay(true).expect("nodelay");
    let (reader, writer) = tokio_util::compat::TokioAsyncReadCompatExt::compat(stream).split();
    Box::new(twoparty::VatNetwork::new(
        futures_util::io::BufReader::new(reader),
        futures_util::io::BufWriter::new(writer),
        side,
        Default::default(),
    ))
}

struct Client(bench::Client);

fn ce(e: capnp::Error) -> String {
    e.to_string()
}

impl Client {
    async fn call_inner(&self, input: &Input, check: bool) -> R<Result<(), String>> {
        let c = &self.0;
        Ok(match input {
            Input::Echo(b) => {
                let mut rq = c.echo_request();
                rq.get().set_data(b);
                let r = rq.send().promise.await?;
                check_echo(r.get()?.get_data()?, b, check)
            }
            Input::Answer(n) => {
                let mut rq = c.get_answer_request();
                rq.get().set_n(*n);
                let r = rq.send().promise.await?;
                check_eq("answer", r.get()?.get_answer(), 41 + n)
            }
            Input::Blob(size) => {
                let mut rq = c.get_blob_request();
                rq.get().set_size(*size);
                let r = rq.send().promise.await?;
                check_blob(r.get()?.get_data()?, *size, check)
            }
            Input::Structs => {
                let rq = c.get_structs_request();
                let r = rq.send().promise.await?;
                let s: Vec<pb::Student> = r
                    .get()?
                    .get_students()?
                    .iter()
                    .map(get_student)
                    .collect::<R<_>>()?;
                if check {
                    common::check_students(&s)
                } else {
                    check_eq("structs", s.len(), common::K)
                }
            }
            Input::U32(v) => {
                let mut rq = c.nymph_uint32_request();
                rq.get().set_value(*v);
                let r = rq.send().promise.await?;
                check_eq("nymph_uint32", r.get()?.get_value(), *v)
            }
            Input::F64(v) => {
                let mut rq = c.nymph_double_request();
                rq.get().set_value(*v);
                let r = rq.send().promise.await?;
                check_eq("nymph_double", r.get()?.get_value(), *v)
            }
            Input::Array(vals) => {
                let mut rq = c.nymph_array_request();
                {
                    let mut l = rq.get().init_values(vals.len() as u32);
                    for (i, v) in vals.iter().enumerate() {
                        l.set(i as u32, *v);
                    }
                }
                let r = rq.send().promise.await?;
                let back: Vec<u32> = r.get()?.get_values()?.iter().collect();
                check_array(&back, vals)
            }
            Input::NBlob(b) => {
                let mut rq = c.nymph_blob_request();
                rq.get().set_data(b);
                let r = rq.send().promise.await?;
                check_echo(r.get()?.get_data()?, b, check)
            }
        })
    }
}

impl AsyncCall for Client {
    async fn call(&self, input: &Input, check: bool) -> Result<(), String> {
        self.call_inner(input, check).await.map_err(ce)?
    }
}

const CONNS: usize = 4;

/// capnp-rpc, two-party VatNetwork over TCP (peer `capnp`). A topspin-bench peer: started by
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
    // The server: on its own thread in this process, or a child process of its own
    // (`--separate-processes`, see common::placement).
    let addr: SocketAddr = match common::placement::separate_server() {
        Some(a) => a.parse().expect("server address"),
        None => {
            let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("server runtime");
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("bind");
                    tx.send(l.local_addr().expect("addr")).expect("send addr");
                    let svc: bench::Client = capnp_rpc::new_client(Svc);
                    while let Ok((s, _)) = l.accept().await {
                        let net = network(s, rpc_twoparty_capnp::Side::Server);
                        let rpc = RpcSystem::new(net, Some(svc.clone().client));
                        tokio::task::spawn_local(rpc);
                    }
                });
            });
            let addr = rx.recv().expect("server address");
            common::placement::server_only(&addr.to_string());
            addr
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let local = tokio::task::LocalSet::new();
    let clients: Vec<Client> = local.block_on(&rt, async {
        let mut v = Vec::new();
        for _ in 0..CONNS {
            let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let mut rpc = RpcSystem::new(network(s, rpc_twoparty_capnp::Side::Client), None);
            let c: bench::Client = rpc.bootstrap(rpc_twoparty_capnp::Side::Server);
            tokio::task::spawn_local(rpc);
            v.push(Client(c));
        }
        v
    });
    common::serve_commands("capnp", |cmd| {
        local.block_on(&rt, common::run_async(&clients, cmd))
    });
}
