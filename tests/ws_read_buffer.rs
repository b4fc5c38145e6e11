//! Issue 28: the worker's dial reads in large passes (a 1 GiB upload took a
//! quarter of a million 4 KiB `recvfrom`s in the worker), the relay's side
//! keeps its small read buffer (5,000 idle workers), and a dialer can ask
//! for either. (Large bodies through a real relay and worker, both ways,
//! are in `tests/readme_programs.rs` and `tests/e2e.rs`; the relay's
//! read-ahead has its unit tests in `src/ws/read_ahead.rs`.)

use std::net::SocketAddr;
use std::time::Duration;
use worker_relay::connect::{Token, TokenTable, WorkerHandshake};
use worker_relay_hyper::gateway::Gateway;
use worker_relay_hyper::server::{serve, ServerConfig};
use worker_relay_hyper::ws::{self, Dialer, DIAL_READ_BUFFER, READ_BUFFER};

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
    const { assert!(DIAL_READ_BUFFER >= 64 << 10 && READ_BUFFER <= 4 << 10) };
    let (addr, _gateway) = relay().await;
    let url = format!("ws://{addr}/connect");

    let default = ws::dial(&url, &handshake(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        default.into_inner().get_config().read_buffer_size,
        DIAL_READ_BUFFER
    );
    // The relay frees the id once the first connection is gone.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let small = Dialer::new()
        .timeout(Duration::from_secs(5))
        .read_buffer(READ_BUFFER);
    let socket = small.dial(&url, &handshake()).await.unwrap();
    assert_eq!(
        socket.into_inner().get_config().read_buffer_size,
        READ_BUFFER
    );
}
