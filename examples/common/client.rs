//! A minimal HTTP/1.1 client on hyper, for the demo and the tests.
#![allow(dead_code)] // shared by several examples and tests, each using a part

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;

/// A response read to the end (or as far as it went).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
    /// Whether the body ended cleanly (false: the connection failed mid-body).
    pub complete: bool,
}

/// Sends one request on a new connection and reads the whole answer.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let _ = stream.set_nodelay(true);
    request_on(stream, &addr.to_string(), method, target, headers, body).await
}

/// Sends one request on `io` (a new connection: TCP, TLS, …) to `host`
/// and reads the whole answer.
pub async fn request_on<I>(
    io: I,
    host: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Result<Answer, Box<dyn std::error::Error + Send + Sync>>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(target)
        .header("host", host);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = sender.send_request(req.body(Full::new(body))?).await?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    let mut out = Vec::new();
    let mut complete = true;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    out.extend_from_slice(&d);
                }
            }
            Err(_) => {
                complete = false;
                break;
            }
        }
    }
    Ok(Answer {
        status,
        headers,
        body: Bytes::from(out),
        complete,
    })
}
