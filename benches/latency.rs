//! Small-request latency on loopback, through the relay vs direct (see
//! BENCHMARKS.md). A plain harness (no criterion): criterion reports means,
//! and this needs percentiles.
//!
//! `GET /health` (15-byte answer) with the worker token, the same app as in
//! `e2e`. Requests go one at a time, alternating relay and direct so that both
//! see the same machine noise:
//!
//! - keep-alive: one HTTP/1.1 connection per path, `ROUNDS` requests each;
//! - new connection per request (as the examples' client does), `ROUNDS / 4` each.
//!
//! Prints p50, p90, p99, mean and max per path, and the relay/direct ratio.
//! `LATENCY_ROUNDS=N` changes the number of rounds (default 5000).

mod support;
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use std::time::{Duration, Instant};

const WARMUP: usize = 200;

struct Summary {
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
    max: f64,
}

fn summarize(mut v: Vec<Duration>) -> Summary {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let pct = |p: f64| us(v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]);
    Summary {
        p50: pct(0.50),
        p90: pct(0.90),
        p99: pct(0.99),
        mean: v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64,
        max: us(*v.last().unwrap()),
    }
}

fn print(kind: &str, n: usize, relay: &Summary, direct: &Summary) {
    println!(
        "| {kind} | relay | {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        relay.p50, relay.p90, relay.p99, relay.mean, relay.max
    );
    println!(
        "| {kind} | direct | {n} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
        direct.p50, direct.p90, direct.p99, direct.mean, direct.max
    );
    println!(
        "| {kind} | relay / direct | | {:.2}× | {:.2}× | {:.2}× | {:.2}× | |",
        relay.p50 / direct.p50,
        relay.p90 / direct.p90,
        relay.p99 / direct.p99,
        relay.mean / direct.mean
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` would not: then run a smoke round.
    let bench = std::env::args().any(|a| a == "--bench");
    let rounds: usize = std::env::var("LATENCY_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench { 5000 } else { 20 });
    let rt = support::runtime();
    let stack = rt.block_on(support::start());
    let (relay_addr, relay_target) = stack.target(true, "/health");
    let (direct_addr, direct_target) = stack.target(false, "/health");
    let auth = stack.auth.clone();

    // The client runs as a task of the runtime too (no third busy thread).
    let run = rt.spawn(async move {
        let mut relay = support::Conn::open(relay_addr).await.unwrap();
        let mut direct = support::Conn::open(direct_addr).await.unwrap();
        for _ in 0..WARMUP.min(rounds) {
            relay.send("GET", &relay_target, &auth, None).await.unwrap();
            direct
                .send("GET", &direct_target, &auth, None)
                .await
                .unwrap();
        }
        let (mut kr, mut kd) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for _ in 0..rounds {
            let t = Instant::now();
            let r = relay.send("GET", &relay_target, &auth, None).await.unwrap();
            kr.push(t.elapsed());
            assert_eq!(r, (200, 15));
            let t = Instant::now();
            let r = direct
                .send("GET", &direct_target, &auth, None)
                .await
                .unwrap();
            kd.push(t.elapsed());
            assert_eq!(r, (200, 15));
        }
        let fresh = (rounds / 4).max(1);
        let (mut nr, mut nd) = (Vec::with_capacity(fresh), Vec::with_capacity(fresh));
        for _ in 0..fresh {
            let t = Instant::now();
            let r = support::once(relay_addr, "GET", &relay_target, &auth, None)
                .await
                .unwrap();
            nr.push(t.elapsed());
            assert_eq!(r, (200, 15));
            let t = Instant::now();
            let r = support::once(direct_addr, "GET", &direct_target, &auth, None)
                .await
                .unwrap();
            nd.push(t.elapsed());
            assert_eq!(r, (200, 15));
        }
        (kr, kd, nr, nd)
    });
    let (keep_relay, keep_direct, new_relay, new_direct) = rt.block_on(run).unwrap();
    let fresh = new_relay.len();
    let threads = match std::env::var("BENCH_THREADS").as_deref() {
        Ok("1") => "one thread",
        _ => "2 worker threads",
    };
    println!("\nGET /health latency, µs (loopback, one tokio runtime, {threads})\n");
    println!("| connection | path | requests | p50 | p90 | p99 | mean | max |");
    println!("|---|---|---|---|---|---|---|---|");
    print(
        "keep-alive",
        rounds,
        &summarize(keep_relay),
        &summarize(keep_direct),
    );
    print(
        "new per request",
        fresh,
        &summarize(new_relay),
        &summarize(new_direct),
    );
    rt.shutdown_timeout(Duration::from_secs(1));
}
