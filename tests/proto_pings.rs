//! Who answers the peer's WebSocket pings (issue 44, the ping contract):
//! the WebSocket library, as tungstenite does, unless the configuration
//! asks the machine to (`answer_pings`), for libraries that hand pings to
//! the application (actix-ws). Then the machine sends one pong, for the
//! latest ping, ahead of body chunks, on both sides and through `rt`.

mod common;

use bytes::Bytes;
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{SinkExt, StreamExt};
use std::time::Instant;
use worker_relay::frame::{Headers, Message, RequestHead, ResponseHead};
use worker_relay::proto::{RelayConfig, RelayConnection, WorkerConfig, WorkerConnection};

fn ping(data: &[u8]) -> Message {
    Message::Ping(Bytes::copy_from_slice(data))
}

/// The pongs among what a machine sends now (`|| machine.poll_transmit()`).
fn pongs(next: impl FnMut() -> Option<Message>) -> Vec<Bytes> {
    std::iter::from_fn(next)
        .filter_map(|m| match m {
            Message::Pong(p) => Some(p),
            _ => None,
        })
        .collect()
}

#[test]
fn by_default_the_machine_leaves_pings_to_the_websocket_library() {
    assert!(!RelayConfig::default().answer_pings());
    assert!(!WorkerConfig::default().answer_pings());
    let mut relay = RelayConnection::default();
    relay.handle_message(ping(b"r"), Instant::now()).unwrap();
    assert_eq!(pongs(|| relay.poll_transmit()), Vec::<Bytes>::new());
    let mut worker = WorkerConnection::default();
    worker.handle_message(ping(b"w"), Instant::now()).unwrap();
    assert_eq!(pongs(|| worker.poll_transmit()), Vec::<Bytes>::new());
}

#[test]
fn asked_to_each_side_answers_a_ping_with_its_data() {
    let config = RelayConfig::builder().answer_pings(true).build().unwrap();
    let mut relay = RelayConnection::new(config);
    relay
        .handle_message(ping(b"from the worker"), Instant::now())
        .unwrap();
    assert_eq!(
        pongs(|| relay.poll_transmit()),
        vec![Bytes::from_static(b"from the worker")]
    );

    let config = WorkerConfig::builder().answer_pings(true).build().unwrap();
    let mut worker = WorkerConnection::new(config);
    worker
        .handle_message(ping(b"from the relay"), Instant::now())
        .unwrap();
    assert_eq!(
        pongs(|| worker.poll_transmit()),
        vec![Bytes::from_static(b"from the relay")]
    );
    // Answered once.
    assert_eq!(pongs(|| worker.poll_transmit()), Vec::<Bytes>::new());
}

#[test]
fn a_ping_flood_costs_one_pong_with_the_latest_data() {
    let config = WorkerConfig::builder().answer_pings(true).build().unwrap();
    let mut worker = WorkerConnection::new(config);
    for i in 0..10_000u32 {
        worker
            .handle_message(ping(&i.to_be_bytes()), Instant::now())
            .unwrap();
    }
    assert_eq!(
        pongs(|| worker.poll_transmit()),
        vec![Bytes::copy_from_slice(&9_999u32.to_be_bytes())]
    );
    // The next ping is answered again.
    worker
        .handle_message(ping(b"again"), Instant::now())
        .unwrap();
    assert_eq!(
        pongs(|| worker.poll_transmit()),
        vec![Bytes::from_static(b"again")]
    );
}

#[test]
fn the_pong_goes_ahead_of_queued_requests_and_a_ping_over_125_bytes_is_not_answered() {
    let config = RelayConfig::builder().answer_pings(true).build().unwrap();
    let mut relay = RelayConnection::new(config);
    let now = Instant::now();
    relay.advance_time(now);
    let head = RequestHead::new("POST", "/echo", "", Headers::new()).unwrap();
    let key = relay.open_stream(head).unwrap();
    relay.send_body(key, Bytes::from(vec![7u8; 1000])).unwrap();
    relay.handle_message(ping(&[1; 125]), now).unwrap();
    let first = relay.poll_transmit().expect("something to send");
    assert_eq!(first, Message::Pong(Bytes::from(vec![1u8; 125])));
    assert!(
        std::iter::from_fn(|| relay.poll_transmit()).count() >= 2,
        "the request and its body follow"
    );

    relay.handle_message(ping(&[2; 126]), now).unwrap();
    assert_eq!(pongs(|| relay.poll_transmit()), Vec::<Bytes>::new());
}

/// Through `rt`, over a socket that answers no ping itself (the in-memory
/// socket of these tests, as actix-ws): the peer gets its pong only when
/// the configuration asks for it, before the answer to a request it sent
/// after the ping.
#[test]
fn a_worker_driver_over_a_socket_that_answers_no_pings() {
    for answer in [false, true] {
        let mut pool = LocalPool::new();
        let (worker_sock, mut relay_end) = common::mem::socket_pair();
        let config = WorkerConfig::builder()
            .answer_pings(answer)
            .build()
            .unwrap();
        let (mut incoming, driver) =
            worker_relay::rt::worker(worker_sock, common::mem::FuturesTimer, config);
        let spawner = pool.spawner();
        spawner
            .spawn_local(async move {
                let _ = driver.await;
            })
            .unwrap();
        spawner
            .spawn_local(async move {
                while let Some(req) = incoming.next().await {
                    let head = ResponseHead::new(204, Headers::new()).unwrap();
                    let mut sink = req.responder.respond(head).unwrap();
                    let _ = sink.close().await;
                }
            })
            .unwrap();
        let got = pool.run_until(async {
            relay_end.tx.send(ping(b"are you there")).await.unwrap();
            let request =
                r#"{"type":"request","id":1,"method":"GET","path":"/x","query":"","headers":[]}"#;
            relay_end
                .tx
                .send(Message::Text(request.into()))
                .await
                .unwrap();
            // Everything up to the response's head (bounded: the worker
            // answers the request at once).
            let mut got = Vec::new();
            while let Some(m) = relay_end.rx.next().await {
                let head = matches!(&m, Message::Text(t) if t.contains(r#""type":"response""#));
                got.push(m);
                if head {
                    break;
                }
            }
            got
        });
        let pong = Message::Pong(Bytes::from_static(b"are you there"));
        assert_eq!(
            got.contains(&pong),
            answer,
            "answer_pings {answer}: the worker sent {got:?}"
        );
        assert!(matches!(got.last(), Some(Message::Text(_))), "{got:?}");
    }
}
