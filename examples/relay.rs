//! The relay example: presents connected workers over HTTP.
//!
//! ```sh
//! cargo run --release --example relay -- --listen 127.0.0.1:8080 --tokens tokens.txt
//! ```
//!
//! `tokens.txt` holds lines `<worker-id> <connect-token>`. Workers dial
//! `ws://127.0.0.1:8080/connect`; worker `<id>` is served at
//! `http://127.0.0.1:8080/w/<id>/…`.

#[path = "common/overflow.rs"]
mod overflow;
#[path = "common/relay_server.rs"]
mod relay_server;
#[path = "common/ws.rs"]
mod ws;

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: relay --listen HOST:PORT --tokens FILE");
    ExitCode::from(2)
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut listen = None;
    let mut tokens = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next(),
            "--tokens" => tokens = args.next(),
            _ => return usage(),
        }
    }
    let (Some(listen), Some(tokens)) = (listen, tokens) else {
        return usage();
    };
    let text = match std::fs::read_to_string(&tokens) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("relay: cannot read {tokens}: {e}");
            return ExitCode::from(2);
        }
    };
    let table = match relay_server::load_tokens(&text) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("relay: {tokens}: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("relay: cannot listen on {listen}: {e}");
            return ExitCode::from(1);
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or(listen);
    let workers: Vec<String> = table.workers().map(|w| w.to_string()).collect();
    eprintln!(
        "relay: listening on {addr}; workers dial ws://{addr}{}; known workers: {}",
        relay_server::CONNECT_PATH,
        workers.join(", ")
    );
    let relay = relay_server::Relay::new(table);
    tokio::select! {
        r = relay_server::serve(listener, relay) => {
            if let Err(e) = r {
                eprintln!("relay: {e}");
                return ExitCode::from(1);
            }
        }
        _ = tokio::signal::ctrl_c() => eprintln!("relay: interrupted"),
    }
    ExitCode::SUCCESS
}
