//! Heap allocations per unary call in steady state, client and server together, counted with
//! a counting global allocator over 10,000 warm calls. A count, not a timing: stable anywhere.

use bytes::Bytes;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use topspin::codec::RawCodec;
use topspin::{Channel, Request, Response, Server};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The bound this test enforces, per call (client + server): none in steady state — the
/// client's completion and the server's handler future live in reused memory, buffers are
/// reclaimed in place. The margin only admits amortized growth (under one per 100 calls).
const MAX_ALLOCS_PER_CALL: f64 = 0.01;

/// The counters are process-wide: the tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Allocations per call (client + server) of 10,000 warm unary calls through `codec`.
fn measure<C>(codec: C, message: C::Encode) -> (f64, f64)
where
    C: topspin::codec::Codec<Decode = <C as topspin::codec::Codec>::Encode>,
    C::Encode: Clone + Sync,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let server = Server::builder()
            .unary(
                "/a.A/Echo",
                codec.clone(),
                |req: Request<C::Decode>| async move { Ok(Response::new(req.into_inner())) },
            )
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap();
        let addr = server.local_addr().clone();
        let handle = server.shutdown_handle();
        tokio::spawn(server.serve());
        let ch = Channel::connect(addr).await.unwrap();
        let call = |ch: Channel, msg: C::Encode| {
            let codec = codec.clone();
            async move {
                ch.unary(codec, "/a.A/Echo", Request::new(msg))
                    .await
                    .unwrap();
            }
        };
        for _ in 0..2_000 {
            call(ch.clone(), message.clone()).await;
        }
        const N: u64 = 10_000;
        let a0 = ALLOCS.load(Ordering::Relaxed);
        let b0 = BYTES.load(Ordering::Relaxed);
        for _ in 0..N {
            call(ch.clone(), message.clone()).await;
        }
        let allocs = (ALLOCS.load(Ordering::Relaxed) - a0) as f64 / N as f64;
        let bytes = (BYTES.load(Ordering::Relaxed) - b0) as f64 / N as f64;
        handle.shutdown(std::time::Duration::from_secs(1)).await;
        (allocs, bytes)
    })
}

#[test]
fn protobuf_echo_allocations_per_call() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A protobuf message whose bytes field decodes as a slice of the receive buffer.
    let (allocs, bytes) = measure(
        topspin::codec::ProstCodec::<Bytes, Bytes>::default(),
        Bytes::from_static(b"twenty bytes payload"),
    );
    println!(
        "allocations per protobuf unary call (client + server): {allocs:.4} ({bytes:.0} bytes)"
    );
    assert!(
        allocs <= MAX_ALLOCS_PER_CALL,
        "{allocs:.4} allocations per call, bound {MAX_ALLOCS_PER_CALL}"
    );
}

#[test]
fn unary_echo_allocations_per_call() {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (allocs, bytes) = measure(RawCodec, Bytes::from_static(b"twenty bytes payload"));
    println!("allocations per unary call (client + server): {allocs:.4} ({bytes:.0} bytes)");
    assert!(
        allocs <= MAX_ALLOCS_PER_CALL,
        "{allocs:.4} allocations per call, bound {MAX_ALLOCS_PER_CALL}"
    );
}
