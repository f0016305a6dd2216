//! Frame codec micro-benchmarks: encode and decode of CALL and MESSAGE frames.
//!
//! Run with `cargo bench -p topspin-proto --bench codec`. Before the timed runs, every case is
//! also run a few thousand times under a counting global allocator and its heap allocations per
//! operation are printed (`allocs/op`); the target is 0 for decoding and for encoding into a
//! warm buffer.

use bytes::BytesMut;
use bytestring::ByteString;
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use topspin_proto::frame::{CallFrame, Frame, FrameDecoder, Header, MessageFrame, HEADER_LEN};
use topspin_proto::{CallId, Metadata, Settings};

/// The system allocator, counting every allocation (and reallocation).
struct CountingAlloc;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// Runs `op` to warm it up, then counts the heap allocations of 10 000 more runs; prints and
/// returns the mean per run. Called outside criterion's timing.
fn allocs_per_op(name: &str, mut op: impl FnMut()) -> f64 {
    const RUNS: u64 = 10_000;
    for _ in 0..100 {
        op();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..RUNS {
        op();
    }
    let per_op = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / RUNS as f64;
    println!("allocs/op  {name:<36} {per_op}");
    per_op
}

fn call_named() -> Frame {
    Frame::Call(CallFrame {
        call_id: CallId(1),
        method_id: 1,
        method_name: Some(ByteString::from_static("/echo.Echo/Say")),
        codec: 0,
        timeout_us: 1_500_000,
        metadata: Metadata::builder()
            .text("user-agent", "topspin/0.1")
            .expect("valid metadata")
            .build(),
    })
}

fn call_interned() -> Frame {
    Frame::Call(CallFrame {
        call_id: CallId(3),
        method_id: 1,
        method_name: None,
        codec: 0,
        timeout_us: 0,
        metadata: Metadata::new(),
    })
}

fn message(len: usize) -> Frame {
    // Built through BytesMut::freeze so that cloning the body is a reference count increment
    // from the first clone on (a `Bytes` made from a `Vec` allocates once when first shared).
    let mut body = BytesMut::with_capacity(len);
    body.extend((0..len).map(|i| i as u8));
    Frame::Message(MessageFrame {
        call_id: CallId(7),
        end_stream: false,
        total_len: None,
        chunk: body.freeze(),
    })
}

const SIZES: [(&str, usize); 3] = [("20B", 20), ("2KB", 2 * 1024), ("2MB", 2 * 1024 * 1024)];

fn cases() -> Vec<(String, Frame)> {
    let mut v = vec![
        ("call_named_1md".to_owned(), call_named()),
        ("call_interned".to_owned(), call_interned()),
    ];
    for (name, len) in SIZES {
        v.push((format!("message_{name}"), message(len)));
    }
    v
}

fn encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("encode");
    for (name, frame) in cases() {
        // A warm buffer: cleared (length 0, capacity kept) before every encode.
        let mut buf = BytesMut::with_capacity(HEADER_LEN + frame.payload_len());
        let wire_len = (HEADER_LEN + frame.payload_len()) as u64;

        // Full encode: header, fixed fields and body all copied into `buf`.
        allocs_per_op(&format!("encode/{name}"), || {
            buf.clear();
            frame.encode(&mut buf);
            black_box(&buf);
        });
        group.throughput(Throughput::Bytes(wire_len));
        group.bench_function(BenchmarkId::new("full", &name), |b| {
            b.iter(|| {
                buf.clear();
                black_box(&frame).encode(&mut buf);
                black_box(&buf);
            })
        });

        // Zero-copy path: only the head is written; the body is returned by reference, for a
        // vectored write straight from the caller's buffer. Cost is independent of the size.
        if matches!(frame, Frame::Message(_)) {
            allocs_per_op(&format!("encode_head/{name}"), || {
                buf.clear();
                black_box(frame.encode_head(&mut buf));
            });
            // Bytes per second would be meaningless here: the body is not touched.
            group.throughput(Throughput::Elements(1));
            group.bench_function(BenchmarkId::new("head", &name), |b| {
                b.iter(|| {
                    buf.clear();
                    black_box(black_box(&frame).encode_head(&mut buf));
                })
            });
        }
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    let max_frame_size = Settings::default().max_frame_size();
    for (name, frame) in cases() {
        let wire = frame.to_bytes();
        group.throughput(Throughput::Bytes(wire.len() as u64));
        if wire.len() <= 64 * 1024 {
            // Small frames go through FrameDecoder, as received bytes would. The receive buffer
            // is refilled from a pre-built encoding each iteration; for frames this small the
            // copy is a few nanoseconds. After the first round the buffer is in its shared
            // (reference counted) form and, once the previous frame is dropped, `reserve`
            // reclaims it in place, so the refill does not allocate either.
            let mut dec = FrameDecoder::new(max_frame_size);
            let mut buf = BytesMut::with_capacity(wire.len());
            let mut op = |buf: &mut BytesMut| {
                buf.clear();
                buf.extend_from_slice(&wire);
                let f = dec
                    .decode(buf)
                    .expect("valid frame")
                    .expect("complete frame");
                black_box(f)
            };
            let mut dropped = |buf: &mut BytesMut| drop(op(buf));
            allocs_per_op(&format!("decode/{name}"), || dropped(&mut buf));
            assert_eq!(op(&mut buf), frame);
            group.bench_function(BenchmarkId::new("decoder", &name), |b| {
                b.iter(|| op(&mut buf))
            });
        } else {
            // For a 2 MB frame, refilling a BytesMut would measure a 2 MB memcpy, not the codec.
            // Decoding proper starts once the bytes are in memory: parse the header, then
            // `Frame::decode` the payload, which it takes by reference (a `Bytes` clone is a
            // reference count increment) and slices, never copies. That is what is timed here;
            // `FrameDecoder::decode` only adds the header peek and a `split_to` around it.
            let header = Header::parse(wire[..HEADER_LEN].try_into().expect("12 bytes"));
            let payload = wire.slice(HEADER_LEN..);
            let op = || {
                let h = Header::parse(black_box(&wire)[..HEADER_LEN].try_into().expect("12 bytes"));
                debug_assert_eq!(h, header);
                black_box(Frame::decode(&h, payload.clone()).expect("valid frame"))
            };
            allocs_per_op(&format!("decode/{name}"), || drop(op()));
            assert_eq!(op(), frame);
            group.throughput(Throughput::Elements(1));
            group.bench_function(BenchmarkId::new("frame_decode", &name), |b| b.iter(op));
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    targets = encode, decode
}
criterion_main!(benches);
