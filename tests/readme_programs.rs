//! Issue 29: the programs of README.md's "Using the crate" (an axum embed,
//! a worker around an axum router, a tunnel to a local server) and its
//! frame example are these, as they stand in the README, and they work:
//! one test checks that each README block is here verbatim (but for the
//! fixed addresses and file names listed in `SUBSTITUTIONS`) and no longer
//! than the lines the README gives it; the others run them.

#[path = "../examples/common/client.rs"]
mod client;

use bytes::Bytes;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};
use worker_relay_hyper::BoxError;

/// README text -> this file's text: the README's fixed port, file and
/// environment variable become the test's (the relay's listener one the
/// test bound on port 0, so no other process can take the port between),
/// and `exit(1)` returns the status instead of ending the test process.
const SUBSTITUTIONS: &[(&str, &str)] = &[
    (
        r#"read_to_string("tokens.txt")"#,
        "read_to_string(tokens_file)",
    ),
    (
        r#"tokio::net::TcpListener::bind("127.0.0.1:8080").await?"#,
        "relay_listener",
    ),
    (r#""ws://127.0.0.1:8080/connect""#, "connect_url"),
    (
        r#"std::env::var("STRATA_WORKER_CONNECT_TOKEN").ok()"#,
        "token_env",
    ),
    ("http://127.0.0.1:8000{target}", "{upstream}{target}"),
    ("std::process::exit(1);", "Ok(1)"),
];

#[rustfmt::skip]
async fn relay_embed(tokens_file: &Path, relay_listener: tokio::net::TcpListener) -> Result<(), BoxError> {
    // README begin
    use axum::{routing::get, Router};
    use worker_relay_hyper::{gateway::Gateway, worker_relay::connect::TokenTable};

    let gateway = Gateway::new(TokenTable::parse(&std::fs::read_to_string(tokens_file)?)?);
    let app = Router::new()
        .route("/status", get(|| async { "the app's own route" }))
        .route_service("/connect", gateway.connect())    // workers dial here
        .route_service("/connect/{id}", gateway.connect()) // or here, naming themselves
        .route_service("/w/{*rest}", gateway.forward()); // callers: /w/<id>/…
    let listener = relay_listener;
    axum::serve(listener, app).await?;
    // README end
    Ok(())
}

/// The worker's exit status (it returns only when it is refused for good).
#[rustfmt::skip]
async fn router_worker(connect_url: &str, token_env: Option<String>) -> Result<i32, BoxError> {
    // README begin
    use axum::{routing::get, Router};
    use worker_relay_hyper::{tunnel::Tunnel, worker_relay::connect::Token};

    let app = Router::new().route("/health", get(|| async { "ok" }));
    // (examples/worker.rs also zeroes and removes the token from its environment)
    let token = Token::from_env_value(token_env)?;
    // Dials, serves, reconnects with the spec's backoff; returns only on a final refusal.
    let refused = Tunnel::new(connect_url, token).run(app).await;
    eprintln!("the relay refused this worker: {refused}");
    Ok(1)
    // README end
}

#[rustfmt::skip]
async fn tunnel_worker(connect_url: &str, token_env: Option<String>, upstream: &str) -> Result<i32, BoxError> {
    let upstream = upstream.to_owned();
    // README begin
    use hyper_util::{client::legacy::Client, rt::TokioExecutor};
    use worker_relay_hyper::{tunnel::{Tunnel, TunnelBody}, worker_relay::connect::Token};

    let client = Client::builder(TokioExecutor::new()).build_http::<TunnelBody>();
    let upstream = tower::service_fn(move |mut req: http::Request<TunnelBody>| {
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        *req.uri_mut() = format!("{upstream}{target}").parse().expect("checked by the relay");
        req.headers_mut().remove(http::header::HOST); // the client sets the upstream's
        client.request(req)
    });
    let token = Token::from_env_value(token_env)?;
    let refused = Tunnel::new(connect_url, token).run(upstream).await;
    eprintln!("the relay refused this worker: {refused}");
    Ok(1)
    // README end
}

#[rustfmt::skip]
#[allow(unused_variables)] // the README shows what `wire` and `end` are
fn frame_example() -> Result<(), BoxError> {
    // README begin
    use worker_relay::frame::{self, Chunk, ControlFrame, Decoded};
    use bytes::Bytes;

    let text = r#"{"type":"request","id":7,"method":"GET","path":"/health","query":"","headers":[]}"#;
    if let Decoded::Control(ControlFrame::Request { id, head }) = frame::decode_text(text)? {
        assert_eq!(head.path(), "/health");
        // Answer: a body chunk, then `end`.
        let chunk = Chunk { id, data: Bytes::from_static(b"{\"status\":\"ok\"}") };
        let wire: Bytes = chunk.encode();              // 00 00 00 07 7b 22 ...
        let end: String = ControlFrame::End { id }.encode(); // {"type":"end","id":7}
    }
    // README end
    Ok(())
}

/// The blocks between `// README begin` and `// README end` above, dedented.
fn programs_here() -> Vec<String> {
    let source = include_str!("readme_programs.rs");
    let mut programs = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in source.lines() {
        match line.trim() {
            "// README begin" => current = Some(Vec::new()),
            "// README end" => programs.push(current.take().expect("begin before end").join("\n")),
            _ => {
                if let Some(lines) = current.as_mut() {
                    lines.push(line.strip_prefix("    ").unwrap_or(line));
                }
            }
        }
    }
    programs
}

/// README's Rust blocks, each with the line count the paragraph before it
/// promises ("in N lines"), if it promises one.
fn readme_blocks() -> Vec<(String, Option<usize>)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let mut blocks = Vec::new();
    let mut rest = readme.as_str();
    while let Some(start) = rest.find("```rust\n") {
        let before = &rest[..start];
        let paragraph = before.trim_end().rsplit("\n\n").next().unwrap_or("");
        let promise = paragraph.split(" in ").skip(1).find_map(|after| {
            let (n, _) = after.split_once(" lines")?;
            n.parse::<usize>().ok()
        });
        let body = &rest[start + "```rust\n".len()..];
        let end = body.find("```\n").expect("an unterminated block");
        blocks.push((body[..end].trim_end().to_owned(), promise));
        rest = &body[end..];
    }
    blocks
}

#[test]
fn each_readme_program_is_here_verbatim_and_within_its_lines() {
    let blocks = readme_blocks();
    let here = programs_here();
    assert_eq!(
        blocks.len(),
        here.len(),
        "README has {} Rust blocks; this file runs {}",
        blocks.len(),
        here.len()
    );
    let mut used = vec![false; SUBSTITUTIONS.len()];
    for (i, ((block, promise), ours)) in blocks.iter().zip(&here).enumerate() {
        let mut expected = block.clone();
        for (k, (from, to)) in SUBSTITUTIONS.iter().enumerate() {
            if expected.contains(from) {
                used[k] = true;
                expected = expected.replace(from, to);
            }
        }
        assert_eq!(
            &expected, ours,
            "README's Rust block {i} is not what this file runs"
        );
        let lines = block.lines().count();
        if let Some(promise) = promise {
            assert!(
                lines <= *promise,
                "README's block {i} has {lines} lines; the README says {promise}"
            );
        }
    }
    // The three programs promise a count; every substitution is still needed.
    assert_eq!(blocks.iter().filter(|(_, p)| p.is_some()).count(), 3);
    assert!(used.iter().all(|u| *u), "unused substitutions: {used:?}");
}

#[test]
fn the_frame_example_runs() {
    frame_example().unwrap();
}

const TOKENS: &str = "abc ct-abc-0123456789\nup ct-up-01234567890\n";

/// A listener on a loopback port of its own, for the README's relay.
async fn relay_listener() -> tokio::net::TcpListener {
    tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()
}

/// The upstream of the tunnel: answers with what it received (method,
/// target, `Host`) in `x-seen` and the body it was sent.
async fn upstream_server() -> String {
    use axum::{body::Body, extract::Request, response::Response};
    let app = tower::service_fn(|req: Request| async move {
        let seen = format!(
            "{} {} {}",
            req.method(),
            req.uri(),
            req.headers()
                .get("host")
                .map_or("-", |h| h.to_str().unwrap_or("?"))
        );
        let body = Body::new(req.into_body());
        Ok::<_, std::convert::Infallible>(
            Response::builder()
                .header("x-seen", seen)
                .body(body)
                .unwrap(),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        async move { axum::serve(listener, axum::Router::new().fallback_service(app)).await },
    );
    format!("http://{addr}")
}

/// Asks `target` until it answers `status`, for at most 20 s.
async fn until(addr: SocketAddr, target: &str, status: u16) -> client::Answer {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match client::request(addr, "GET", target, &[], Bytes::new()).await {
            Ok(a) if a.status == status => return a,
            other => assert!(
                Instant::now() < end,
                "{target} did not answer {status}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The README's relay on a port of its own with `TOKENS`: its address, its
/// connect URL, the tokens file's directory, and its task.
async fn start_relay() -> (
    SocketAddr,
    String,
    tempfile::TempDir,
    tokio::task::JoinHandle<Result<(), BoxError>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, TOKENS).unwrap();
    let listener = relay_listener().await;
    let addr: SocketAddr = listener.local_addr().unwrap();
    let connect_url = format!("ws://{addr}/connect");
    let relay = tokio::spawn(async move { relay_embed(&tokens, listener).await });
    let status = until(addr, "/status", 200).await;
    assert_eq!(&status.body[..], b"the app's own route");
    (addr, connect_url, dir, relay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_three_programs_serve_callers_through_each_other() {
    let (addr, connect_url, _dir, relay) = start_relay().await;
    let upstream = upstream_server().await;

    let (url, up) = (connect_url.clone(), upstream.clone());
    let router =
        tokio::spawn(async move { router_worker(&url, Some("ct-abc-0123456789".into())).await });
    let url = connect_url.clone();
    let tunnel =
        tokio::spawn(
            async move { tunnel_worker(&url, Some("ct-up-01234567890".into()), &up).await },
        );

    // The router worker serves its app.
    let health = until(addr, "/w/abc/health", 200).await;
    assert_eq!(&health.body[..], b"ok");
    assert_eq!(until(addr, "/w/abc/elsewhere", 404).await.status, 404);

    // The tunnel: path and query as they came, Host the upstream's, a
    // 3 MiB body both ways.
    until(addr, "/w/up/", 200).await;
    let body: Bytes = (0..3 << 20)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let answer = client::request(addr, "POST", "/w/up/echo/x?q=1%202", &[], body.clone())
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert!(answer.complete);
    let host = upstream.trim_start_matches("http://");
    assert_eq!(
        answer.headers["x-seen"],
        format!("POST /echo/x?q=1%202 {host}").as_str()
    );
    assert_eq!(answer.body.len(), body.len());
    assert!(answer.body == body, "the echoed body differs");

    // Targets a caller may send: the tunnel's `expect` must hold for every
    // one the relay forwards (a panic there would fail the stream: 502).
    // Each reaches the upstream as it came, or is refused by the relay.
    for target in [
        "//evil.example/x",
        "/a%20b/%2e%2e/c",
        "/{x}/;p=1/~u@h:1",
        "/q?a=1&b=%ff&c=|^`{}",
        "/q?",
        "/%00",
    ] {
        let a = client::request(addr, "GET", &format!("/w/up{target}"), &[], Bytes::new())
            .await
            .unwrap();
        match a.status {
            // An empty query is no query: the `request` frame's `query`
            // is "" either way.
            200 => assert_eq!(
                a.headers["x-seen"],
                format!("GET {} {host}", target.trim_end_matches('?')).as_str(),
                "{target}"
            ),
            400 | 404 => {}
            other => panic!("{target}: {other}"),
        }
    }

    assert!(!router.is_finished() && !tunnel.is_finished() && !relay.is_finished());
    router.abort();
    tunnel.abort();
    relay.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_worker_program_exits_1_and_a_missing_tokens_file_is_an_error() {
    let (_, connect_url, dir, relay) = start_relay().await;

    // A token the relay does not know: 401, final, so `run` returns.
    let wrong = Some("ct-nobody-0123456789".to_owned());
    let status = tokio::time::timeout(Duration::from_secs(20), router_worker(&connect_url, wrong))
        .await
        .expect("a refused worker returns")
        .unwrap();
    assert_eq!(status, 1);
    let status = tokio::time::timeout(
        Duration::from_secs(20),
        tunnel_worker(&connect_url, None, "http://127.0.0.1:9"),
    )
    .await
    .expect("a worker without a token is refused too")
    .unwrap();
    assert_eq!(status, 1);
    relay.abort();

    // The embed's `?`s: no tokens file, no relay.
    let missing = relay_embed(&dir.path().join("absent.txt"), relay_listener().await).await;
    assert!(missing.is_err());
}
