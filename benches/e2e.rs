//! End to end on loopback with the examples' stacks (see BENCHMARKS.md): a
//! 1 GiB upload and a 1 GiB download through relay + worker, each beside the
//! same app served directly by hyper, in the same group.
//!
//! - `e2e/upload/{relay,direct}`: `POST /sha256` with a 1 GiB body (the app
//!   reads and hashes every byte, answers the digest).
//! - `e2e/download/{relay,direct}`: `GET /bytes?n=1073741824` (the app makes
//!   the body in 256 KiB pieces; the client reads and drops it).
//!
//! One process, one tokio runtime with 2 worker threads (the machine's 2
//! cores) shared by client, relay, worker and direct server; 127.0.0.1 only.
//! Each iteration opens a new client connection.

mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use std::time::Duration;

const GIB: u64 = 1 << 30;

fn e2e(c: &mut Criterion) {
    let rt = support::runtime();
    let stack = rt.block_on(support::start());
    let body = Bytes::from(vec![0xa5u8; GIB as usize]);
    let mut g = c.benchmark_group("e2e");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Bytes(GIB));
    for via_relay in [true, false] {
        let name = if via_relay { "relay" } else { "direct" };
        let (addr, target) = stack.target(via_relay, "/sha256");
        g.bench_function(BenchmarkId::new("upload", name), |b| {
            b.iter(|| {
                let body = body.clone();
                let auth = stack.auth.clone();
                let target = target.clone();
                let (status, n) = rt
                    .block_on(rt.spawn(async move {
                        support::once(addr, "POST", &target, &auth, Some(body)).await
                    }))
                    .unwrap()
                    .unwrap();
                assert_eq!(status, 200);
                assert!(n > 64);
            })
        });
    }
    for via_relay in [true, false] {
        let name = if via_relay { "relay" } else { "direct" };
        let (addr, target) = stack.target(via_relay, &format!("/bytes?n={GIB}"));
        g.bench_function(BenchmarkId::new("download", name), |b| {
            b.iter(|| {
                let auth = stack.auth.clone();
                let target = target.clone();
                let (status, n) = rt
                    .block_on(rt.spawn(async move {
                        support::once(addr, "GET", &target, &auth, None).await
                    }))
                    .unwrap()
                    .unwrap();
                assert_eq!((status, n), (200, GIB));
            })
        });
    }
    g.finish();
    rt.shutdown_timeout(Duration::from_secs(1));
}

criterion_group!(benches, e2e);
criterion_main!(benches);
