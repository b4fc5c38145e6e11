//! Codec benches, each beside its baseline in the same group (see BENCHMARKS.md):
//!
//! - `chunk_decode/<size>`: `decode_binary` of one binary message vs `Bytes::slice`
//!   of the same buffer (zero-copy: time must not grow with the size).
//! - `chunk_encode/<size>`: a whole body split into ≤ 1 MiB chunks and each encoded
//!   to its wire bytes (`split_body` + `encode_chunk`), the body split alone, vs a
//!   plain memcpy of the same bytes into a buffer allocated once.
//! - `control/<frame>`: `decode_text` and `ControlFrame::encode` vs
//!   `serde_json::from_slice::<serde_json::Value>` of the same text.
//! - `hostile_head/1MiB_116k_headers`: a worker's 1 MiB `response` frame of
//!   tiny headers: fed to a `RelayConnection` for an id not in flight (read no
//!   further than its id), and `decode_text_limited` (what the relay does for
//!   a stream in flight: collect up to the bound, scan the rest) vs the
//!   unbounded `decode_text` of the same text; a bare `IgnoredAny` scan for
//!   reference.

use bytes::Bytes;
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use std::hint::black_box;
use std::time::Duration;
use worker_relay::frame::{
    self, encode_chunk, split_body, ControlFrame, Decoded, Headers, RequestHead, StreamId,
    MAX_CHUNK_BODY,
};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

fn size_name(n: usize) -> String {
    if n >= MIB {
        format!("{}MiB", n / MIB)
    } else {
        format!("{}KiB", n / KIB)
    }
}

fn chunk_decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("chunk_decode");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    for size in [KIB, 64 * KIB, MIB] {
        let id = StreamId::new(7).unwrap();
        let msg = encode_chunk(id, &pattern(size));
        // The first clone of a `Bytes` made from a `Vec` promotes it to a shared
        // buffer (one allocation); do it here so both measurements see the same
        // steady state as a received message.
        drop(msg.clone());
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(
            BenchmarkId::new("decode_binary", size_name(size)),
            &msg,
            |b, m| {
                b.iter(|| {
                    let Ok(Decoded::Chunk(c)) = frame::decode_binary(black_box(m).clone()) else {
                        unreachable!()
                    };
                    black_box(c)
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("baseline_bytes_slice", size_name(size)),
            &msg,
            |b, m| b.iter(|| black_box(black_box(m).clone().slice(4..))),
        );
    }
    g.finish();
}

fn chunk_encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("chunk_encode");
    let id = StreamId::new(7).unwrap();
    for size in [64 * KIB, MIB, 16 * MIB, 64 * MIB] {
        if size >= 16 * MIB {
            g.sampling_mode(SamplingMode::Flat)
                .sample_size(10)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2));
        } else {
            g.sampling_mode(SamplingMode::Auto)
                .sample_size(30)
                .warm_up_time(Duration::from_millis(500))
                .measurement_time(Duration::from_secs(2));
        }
        let body = Bytes::from(pattern(size));
        drop(body.clone());
        let mut dst = Dst::new(&body);
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::new("split_encode", size_name(size)), |b| {
            b.iter(|| {
                for piece in split_body(black_box(&body).clone(), MAX_CHUNK_BODY) {
                    black_box(encode_chunk(id, &piece));
                }
            })
        });
        g.bench_function(BenchmarkId::new("split_only", size_name(size)), |b| {
            b.iter(|| {
                for piece in split_body(black_box(&body).clone(), MAX_CHUNK_BODY) {
                    black_box(piece);
                }
            })
        });
        g.bench_function(BenchmarkId::new("baseline_memcpy", size_name(size)), |b| {
            b.iter(|| {
                dst.get().copy_from_slice(black_box(&body[..]));
                black_box(dst.get());
            })
        });
    }
    g.finish();
}

/// 64 KiB bodies at 64 source placements (offsets `k * 68`, which sweep both
/// the alignment within a cache line and the distance modulo 4096 to wherever
/// the allocator puts the encoded chunk), each encoded once per iteration: the
/// expected cost over placements, as for body pieces that arrive at arbitrary
/// addresses. Baseline: memcpy of the same 64 pieces, each to a destination
/// 2048 bytes (mod 4096) from its source.
fn chunk_encode_placements(c: &mut Criterion) {
    const N: usize = 64 * KIB;
    const K: usize = 64;
    const STEP: usize = 68;
    let mut g = c.benchmark_group("chunk_encode_placements");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
        .throughput(Throughput::Bytes((N * K) as u64));
    let id = StreamId::new(7).unwrap();
    let whole = Bytes::from(pattern(N + K * STEP));
    drop(whole.clone());
    let mut dst = Dst::new(&whole);
    g.bench_function(BenchmarkId::new("encode_chunk", "64x64KiB"), |b| {
        b.iter(|| {
            for k in 0..K {
                let piece = &black_box(&whole)[k * STEP..k * STEP + N];
                black_box(encode_chunk(id, piece));
            }
        })
    });
    g.bench_function(BenchmarkId::new("baseline_memcpy", "64x64KiB"), |b| {
        b.iter(|| {
            let d = dst.get();
            for k in 0..K {
                d[k * STEP..k * STEP + N]
                    .copy_from_slice(&black_box(&whole)[k * STEP..k * STEP + N]);
            }
            black_box(d);
        })
    });
    g.finish();
}

/// The memcpy baseline's destination: allocated and touched once, placed so that
/// `(dst - src) % 4096 == 2048`. Two heap blocks a page-multiple apart
/// plus a few bytes ("4K aliasing") make `rep movsb` several times slower on
/// this machine's Zen 3 cores, which would flatter the code under test.
struct Dst {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Dst {
    fn new(src: &[u8]) -> Dst {
        let len = src.len();
        let buf = vec![0x5a; len + 8192];
        let (s, d) = (src.as_ptr() as usize, buf.as_ptr() as usize);
        let start = (2048 + 4096 - (d.wrapping_sub(s) % 4096)) % 4096;
        Dst { buf, start, len }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// A `request` frame as a relay forwards a dispatch: 10 realistic headers.
fn request_frame() -> ControlFrame {
    let headers = Headers::try_from_pairs([
        ("host", "relay.example.com"),
        (
            "authorization",
            "Bearer 3f9c1e7a52b84d06a1c2e9f07b6d4a18c5e2f3a9b0d7c6e1",
        ),
        (
            "content-type",
            "multipart/form-data; boundary=----strata7f3a9c2e1b4d",
        ),
        ("content-length", "52133"),
        ("user-agent", "strata-notebook/0.9.4 python-httpx/0.27.0"),
        ("accept", "application/x-tar, application/json;q=0.9"),
        ("accept-encoding", "gzip, deflate"),
        ("x-request-id", "8d2f6a0e-4b1c-4e7a-9f3d-2c5b8a1e6f90"),
        (
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ),
        ("x-strata-executor-protocol", "v1"),
    ])
    .unwrap();
    assert_eq!(headers.len(), 10);
    let head = RequestHead::new("POST", "/v1/execute", "", headers).unwrap();
    ControlFrame::Request {
        id: StreamId::new(7).unwrap(),
        head,
    }
}

fn control(c: &mut Criterion) {
    let mut g = c.benchmark_group("control");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    let id = StreamId::new(7).unwrap();
    for (name, f) in [
        ("request_10_headers", request_frame()),
        ("end", ControlFrame::End { id }),
        ("abort", ControlFrame::Abort { id }),
    ] {
        let text = f.encode();
        // The frame must round-trip.
        assert_eq!(
            frame::decode_text(&text).unwrap(),
            Decoded::Control(f.clone())
        );
        let value: serde_json::Value = serde_json::from_slice(text.as_bytes()).unwrap();
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(BenchmarkId::new("decode_text", name), |b| {
            b.iter(|| black_box(frame::decode_text(black_box(&text)).unwrap()))
        });
        // The same text by the serde path alone (the scanner's reference).
        g.bench_function(BenchmarkId::new("decode_text_reference", name), |b| {
            b.iter(|| black_box(frame::decode_text_reference(black_box(&text), None).unwrap()))
        });
        g.bench_function(BenchmarkId::new("encode", name), |b| {
            b.iter(|| black_box(black_box(&f).encode()))
        });
        g.bench_function(BenchmarkId::new("baseline_value_parse", name), |b| {
            b.iter(|| {
                black_box(
                    serde_json::from_slice::<serde_json::Value>(black_box(text.as_bytes()))
                        .unwrap(),
                )
            })
        });
        // For reference: the untyped serializer on the same frame.
        g.bench_function(BenchmarkId::new("ref_value_to_string", name), |b| {
            b.iter(|| black_box(serde_json::to_string(black_box(&value)).unwrap()))
        });
    }
    g.finish();
}

/// A `response` frame of `["a",""]` headers filling `len` bytes.
fn hostile_response(len: usize) -> String {
    let pair = r#"["a",""],"#;
    let n = (len - 100) / pair.len();
    format!(
        r#"{{"type":"response","id":9,"status":200,"headers":[{}["a",""]]}}"#,
        pair.repeat(n)
    )
}

fn hostile_head(c: &mut Criterion) {
    let mut g = c.benchmark_group("hostile_head");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    let text = hostile_response(MIB);
    let name = "1MiB_116k_headers";
    let mut relay = worker_relay::proto::RelayConnection::default();
    let now = std::time::Instant::now();
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function(BenchmarkId::new("relay_handle_message", name), |b| {
        b.iter_batched(
            || worker_relay::frame::Message::Text(text.clone()),
            |m| relay.handle_message(m, now).unwrap(),
            criterion::BatchSize::LargeInput,
        )
    });
    assert!(relay.stats().messages_ignored > 0);
    // For a stream in flight the frame is read to the end, its headers
    // collected only up to the bound.
    let limits = frame::HeadLimits::default();
    g.bench_function(BenchmarkId::new("decode_text_limited", name), |b| {
        b.iter(|| black_box(frame::decode_text_limited(black_box(&text), &limits).unwrap_err()))
    });
    g.bench_function(BenchmarkId::new("baseline_unbounded_decode", name), |b| {
        b.iter(|| black_box(frame::decode_text(black_box(&text)).unwrap()))
    });
    g.bench_function(BenchmarkId::new("ref_ignored_any_scan", name), |b| {
        b.iter(|| {
            black_box(serde_json::from_str::<serde::de::IgnoredAny>(black_box(&text)).unwrap())
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    chunk_decode,
    chunk_encode,
    chunk_encode_placements,
    control,
    hostile_head
);
criterion_main!(benches);
