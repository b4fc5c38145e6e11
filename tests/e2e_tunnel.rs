//! Issue 15, the worker example in tunnel mode (`--upstream`) in front of a
//! plain hyper server, all through the relay example: 1 GiB down and 1 GiB
//! up streamed with the worker's peak RSS under 64 MiB, and HEAD and 304
//! passed through with the connection still usable after them.
#[path = "e2e/support.rs"]
mod support;
// support.rs names these; this test does not use them.
#[path = "../cli/src/worker_app.rs"]
mod worker_app;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use support::*;

const GIB: u64 = 1 << 30;
const PIECE: usize = 256 * 1024;
/// The worker's peak RSS may not pass this while 1 GiB goes each way.
const WORKER_PEAK_KIB: u64 = 64 * 1024;
/// Every transfer, at most.
const TRANSFER_LIMIT: Duration = Duration::from_secs(300);

type BoxBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// `i % 251` for the whole range, one piece longer than any piece so that a
/// piece at any offset is a slice of it.
fn pattern_source() -> Bytes {
    (0..PIECE + 251)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// The `len` pattern bytes from `offset`.
fn piece_at(src: &Bytes, offset: u64, len: usize) -> Bytes {
    let start = (offset % 251) as usize;
    src.slice(start..start + len)
}

/// `n` pattern bytes, made as they are sent.
fn pattern_stream(n: u64) -> BoxBody {
    let src = pattern_source();
    let pieces = stream::unfold(0u64, move |sent| {
        let src = src.clone();
        async move {
            let len = (n - sent).min(PIECE as u64) as usize;
            (len > 0).then(|| {
                let piece = piece_at(&src, sent, len);
                (Ok(Frame::data(piece)), sent + len as u64)
            })
        }
    });
    BodyExt::boxed(StreamBody::new(pieces))
}

/// Reads `body` to its end, checking it is the pattern; returns its length
/// and whether every byte matched and it ended cleanly.
async fn read_pattern<B>(body: B) -> (u64, bool)
where
    B: hyper::body::Body<Data = Bytes>,
{
    let src = pattern_source();
    let mut body = std::pin::pin!(body);
    let (mut n, mut good) = (0u64, true);
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return (n, false);
        };
        if let Ok(data) = frame.into_data() {
            for part in data.chunks(PIECE) {
                good &= part == &piece_at(&src, n, part.len())[..];
                n += part.len() as u64;
            }
        }
    }
    (n, good)
}

fn query_n(req: &Request<Incoming>) -> u64 {
    req.uri()
        .query()
        .and_then(|q| q.strip_prefix("n="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The upstream: a plain hyper server, knowing nothing of the relay.
async fn upstream(req: Request<Incoming>) -> Result<Response<BoxBody>, Infallible> {
    let head = |status: u16| Response::builder().status(status);
    let resp = match (req.method().as_str(), req.uri().path()) {
        ("GET", "/download") => {
            let n = query_n(&req);
            head(200)
                .header("content-length", n)
                .body(pattern_stream(n))
        }
        ("POST", "/upload") => {
            let cl = req.headers().get("content-length").cloned();
            let (n, good) = read_pattern(req.into_body()).await;
            let text = format!("{n} {good} content-length={cl:?}");
            head(200).body(Full::from(text).boxed())
        }
        (_, "/file") => {
            let fresh = req.headers().get("if-none-match").map(|v| v.as_bytes()) == Some(b"\"v1\"");
            let status = if fresh { 304 } else { 200 };
            let body = if fresh {
                Bytes::new()
            } else {
                Bytes::from(vec![b'f'; 4096])
            };
            let mut r = head(status).header("etag", "\"v1\"");
            if !fresh {
                r = r.header("content-length", 4096);
            }
            r.body(Full::from(body).boxed())
        }
        ("GET", "/echo-head") => {
            let saw = |name: &str| {
                req.headers().get(name).map_or("-".into(), |v| {
                    String::from_utf8_lossy(v.as_bytes()).into_owned()
                })
            };
            let text = format!(
                "target={} host={} x-custom={} authorization={}",
                req.uri(),
                saw("host"),
                saw("x-custom"),
                saw("authorization"),
            );
            head(200).body(Full::from(text).boxed())
        }
        _ => head(404).body(Empty::new().boxed()),
    };
    Ok(resp.unwrap())
}

async fn start_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), hyper::service::service_fn(upstream)),
            );
        }
    });
    addr
}

/// One HTTP/1.1 connection to the relay, for several requests.
async fn connection(relay: SocketAddr) -> hyper::client::conn::http1::SendRequest<BoxBody> {
    let tcp = tokio::net::TcpStream::connect(relay).await.unwrap();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

/// Sends `req` on `c` once the connection is ready for it (the previous
/// answer read to its end); a connection closed meanwhile fails the test.
async fn send(
    c: &mut hyper::client::conn::http1::SendRequest<BoxBody>,
    req: Request<BoxBody>,
) -> Response<Incoming> {
    c.ready()
        .await
        .expect("the connection stays open for the next request");
    c.send_request(req).await.unwrap()
}

fn request(method: &str, target: &str) -> hyper::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(target)
        .header("host", "relay.test")
        .header("authorization", auth())
}

/// `VmHWM` (peak RSS) of a process, in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnel_worker_streams_a_gib_each_way_and_passes_head_and_304() {
    let upstream = start_upstream().await;
    // Nothing on disk: the caller here may read more slowly than the
    // worker sends, and a GiB of it in the overflow would depend on the
    // free space of the machine's temporary directory.
    let (relay, port) = relay_process_with(&["--overflow-budget".as_ref(), "0".as_ref()]);
    let mut cmd = Command::new(example_bin("worker"));
    cmd.args(["--connect", &format!("ws://127.0.0.1:{port}/connect")])
        .args(["--upstream", &format!("http://{upstream}")])
        .env("STRATA_WORKER_CONNECT_TOKEN", CONNECT_TOKEN)
        .env("STRATA_WORKER_TOKEN", WORKER_TOKEN);
    let worker = Proc::spawn(cmd);
    assert!(
        relay.wait_log("worker abc connected", Duration::from_secs(20)),
        "{}\n{}",
        relay.log(),
        worker.log()
    );
    let relay_addr: SocketAddr = ([127, 0, 0, 1], port).into();

    // What the upstream sees: the path and query as sent, its own Host, the
    // worker token gone, the other headers as they were.
    let mut c = connection(relay_addr).await;
    let empty = || Empty::new().boxed();
    let r = send(
        &mut c,
        request("GET", "/w/abc/echo-head?a=1&b=%2F")
            .header("x-custom", "kept")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status(), 200);
    let text = r.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        String::from_utf8_lossy(&text),
        format!("target=/echo-head?a=1&b=%2F host={upstream} x-custom=kept authorization=-")
    );

    // HEAD, 304, then a full GET, on one connection: each answer framed
    // right, or the next would fail.
    let r = send(
        &mut c,
        request("HEAD", "/w/abc/file").body(empty()).unwrap(),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-length"],
        "4096",
        "HEAD keeps the length"
    );
    assert_eq!(r.headers()["etag"], "\"v1\"");
    assert!(r.into_body().collect().await.unwrap().to_bytes().is_empty());
    let r = send(
        &mut c,
        request("GET", "/w/abc/file")
            .header("if-none-match", "\"v1\"")
            .body(empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status(), 304);
    assert_eq!(r.headers()["etag"], "\"v1\"");
    assert!(r.into_body().collect().await.unwrap().to_bytes().is_empty());
    let r = send(&mut c, request("GET", "/w/abc/file").body(empty()).unwrap()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.into_body().collect().await.unwrap().to_bytes().len(),
        4096
    );

    // 1 GiB down, streamed: the upstream makes it as it is sent.
    let download = async {
        let r = send(
            &mut c,
            request("GET", "/w/abc/download?n=1073741824")
                .body(empty())
                .unwrap(),
        )
        .await;
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["content-length"], GIB.to_string().as_str());
        read_pattern(r.into_body()).await
    };
    let got = tokio::time::timeout(TRANSFER_LIMIT, download).await;
    assert_eq!(
        got.expect("download in time"),
        (GIB, true),
        "1 GiB down, intact\nrelay: {}\nworker: {}",
        relay.log(),
        worker.log()
    );

    // 1 GiB up, streamed: made as it is sent, checked as the upstream reads.
    let upload = async {
        let r = send(
            &mut c,
            request("POST", "/w/abc/upload")
                .header("content-length", GIB)
                .body(pattern_stream(GIB))
                .unwrap(),
        )
        .await;
        assert_eq!(r.status(), 200);
        r.into_body().collect().await.unwrap().to_bytes()
    };
    let got = tokio::time::timeout(TRANSFER_LIMIT, upload)
        .await
        .expect("upload in time");
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!("{GIB} true content-length=Some(\"{GIB}\")"),
        "1 GiB up, intact, with its length"
    );

    let peak = peak_kib(worker.child.id());
    assert!(
        peak <= WORKER_PEAK_KIB,
        "the worker's peak RSS was {peak} KiB (limit {WORKER_PEAK_KIB} KiB)"
    );
    eprintln!("worker peak RSS after 2 GiB through the tunnel: {peak} KiB");
}
