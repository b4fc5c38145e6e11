//! Issue 28: the worker's dial reads in large passes (a 1 GiB upload took a
//! quarter of a million 4 KiB `recvfrom`s in the worker), the relay's side
//! keeps its small read buffer (5,000 idle workers), and a dialer can ask
//! for either.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use std::net::SocketAddr;
use std::time::Duration;
use worker_relay::connect::{Token, TokenTable, WorkerHandshake};
use worker_relay::frame::{encode_chunk, Message, StreamId};
use worker_relay::gateway::Gateway;
use worker_relay::server::{serve, ServerConfig};
use worker_relay::ws::{self, Dialer, DIAL_READ_BUFFER, READ_BUFFER};

const TOKEN: &str = "rb-token-0123456789abcdef";

async fn relay() -> (SocketAddr, Gateway) {
    let gateway = Gateway::builder(TokenTable::parse(&format!("abc {TOKEN}")).unwrap()).build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, gateway.service(), ServerConfig::default()));
    (addr, gateway)
}

fn handshake() -> WorkerHandshake {
    WorkerHandshake::new(Some(Token::new(TOKEN).unwrap()))
}

#[tokio::test]
async fn the_dial_reads_in_large_passes_unless_told_otherwise() {
    assert!(DIAL_READ_BUFFER >= 64 << 10 && READ_BUFFER <= 4 << 10);
    let (addr, _gateway) = relay().await;
    let url = format!("ws://{addr}/connect");

    let default = ws::dial(&url, &handshake(), Duration::from_secs(5)).await.unwrap();
    assert_eq!(default.into_inner().get_config().read_buffer_size, DIAL_READ_BUFFER);
    // The relay frees the id once the first connection is gone.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let small = Dialer::new()
        .timeout(Duration::from_secs(5))
        .read_buffer(READ_BUFFER);
    let socket = small.dial(&url, &handshake()).await.unwrap();
    assert_eq!(socket.into_inner().get_config().read_buffer_size, READ_BUFFER);
}

/// Whatever the passes, a 1 MiB chunk (the protocol's largest) read in
/// 4 KiB passes and in 128 KiB ones arrives whole and the same, both ways
/// of a connection over loopback with the crate's settings.
#[tokio::test]
async fn a_largest_chunk_arrives_whole_with_either_read_buffer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body: Bytes = (0..1usize << 20).map(|i| (i * 31 % 251) as u8).collect();
    let expect = body.clone();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let ws = tokio_tungstenite::accept_async_with_config(tcp, Some(ws::config()))
            .await
            .unwrap();
        let mut socket = ws::WsSocket(ws);
        let got = socket.next().await.unwrap().unwrap();
        socket.send(got).await.unwrap();
        socket.flush().await.unwrap();
    });
    let (ws, _) = tokio_tungstenite::client_async_with_config(
        format!("ws://{addr}/"),
        tokio::net::TcpStream::connect(addr).await.unwrap(),
        Some(ws::config().read_buffer_size(DIAL_READ_BUFFER)),
    )
    .await
    .unwrap();
    let mut socket = ws::WsSocket(ws);
    let chunk = encode_chunk(StreamId::new(7).unwrap(), &body);
    socket.send(Message::Binary(chunk.clone())).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(back, Message::Binary(chunk));
    assert_eq!(&back_body(&back)[..], &expect[..]);
    server.await.unwrap();
}

fn back_body(m: &Message) -> Bytes {
    match m {
        Message::Binary(b) => b.slice(4..),
        other => panic!("not a chunk: {other:?}"),
    }
}
