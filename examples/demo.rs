//! The demo: a relay, a worker and an HTTP client in one process, on loopback
//! ports it picks, showing what goes through.
//!
//! ```sh
//! cargo run --example demo
//! ```

#[path = "common/client.rs"]
mod client;

use bytes::Bytes;
use std::time::{Duration, Instant};
use worker_relay::connect::{Token, TokenTable, WorkerId};
use worker_relay_cli::{logging, worker_app};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};

fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..4)
        .map(|i| {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(i);
            format!("{:016x}", h.finish())
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let _log = logging::init("demo", logging::json_requested(&args) == Some(true));
    let connect_token = Token::new(random_token())?;
    let worker_token = Token::new(random_token())?;
    let mut tokens = TokenTable::new();
    tokens.insert(WorkerId::new("demo")?, connect_token.clone())?;

    // 1. The relay, on a port the OS picks.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let relay = Gateway::new(tokens);
    tokio::spawn(serve(listener, relay.service(), ServerConfig::default()));
    println!("relay listening on http://{addr}  (workers dial ws://{addr}/connect)");

    // 2. The worker dials out to it.
    tokio::spawn(worker_app::run(worker_app::WorkerOptions {
        connect_url: format!("ws://{addr}/connect"),
        connect_token: Some(connect_token),
        worker_token: Some(worker_token.clone()),
        name: "worker".into(),
        dialer: Default::default(),
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !relay.is_connected("demo") {
        if Instant::now() > deadline {
            return Err("the worker did not connect within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("worker 'demo' connected; it is served at http://{addr}/w/demo/\n");

    let auth = format!("Bearer {}", worker_token.expose_secret());
    let auth = [("authorization", auth.as_str())];

    // 3. Requests through the relay.
    let t = Instant::now();
    let a = client::request(addr, "GET", "/w/demo/health", &auth, Bytes::new()).await?;
    println!(
        "GET  /w/demo/health           -> {} {}  ({:.1} ms)",
        a.status,
        String::from_utf8_lossy(&a.body),
        ms(t)
    );
    if a.status != 200 {
        return Err("health check failed".into());
    }

    let body: Bytes = (0..5 << 20)
        .map(|i: u32| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let t = Instant::now();
    let a = client::request(
        addr,
        "POST",
        "/w/demo/echo",
        &[auth[0], ("content-type", "application/octet-stream")],
        body.clone(),
    )
    .await?;
    let same = a.body == body;
    println!(
        "POST /w/demo/echo (5 MiB)      -> {} {} bytes back, identical: {same}  ({:.1} ms, {:.0} MiB/s both ways)",
        a.status,
        a.body.len(),
        ms(t),
        (2.0 * body.len() as f64 / (1 << 20) as f64) / t.elapsed().as_secs_f64()
    );
    if !same {
        return Err("echo differs".into());
    }

    let t = Instant::now();
    let sleep = client::request(addr, "GET", "/w/demo/sleep?ms=1000", &auth, Bytes::new());
    let health = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let h = client::request(addr, "GET", "/w/demo/health", &auth, Bytes::new()).await;
        (h, ms(t))
    };
    let (s, (h, h_at)) = tokio::join!(sleep, health);
    let (s, h) = (s?, h?);
    println!(
        "GET  /w/demo/sleep?ms=1000     -> {} {}  (done at {:.0} ms)",
        s.status,
        String::from_utf8_lossy(&s.body),
        ms(t)
    );
    println!("GET  /w/demo/health (meanwhile)-> {} (done at {h_at:.0} ms, while the sleep was still running)", h.status);

    let a = client::request(addr, "GET", "/w/demo/health", &[], Bytes::new()).await?;
    println!(
        "GET  /w/demo/health, no token -> {} {}",
        a.status,
        String::from_utf8_lossy(&a.body).trim()
    );
    let a = client::request(addr, "GET", "/w/nobody/health", &auth, Bytes::new()).await?;
    println!(
        "GET  /w/nobody/health         -> {} {}",
        a.status,
        String::from_utf8_lossy(&a.body).trim()
    );

    println!("\ndone: every request went through one WebSocket the worker dialled out.");
    Ok(())
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
