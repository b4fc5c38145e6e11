//! A relay inside an actix-web 4 app: its own route, workers on `/connect`, callers on
//! `/w/<id>/…`, streaming both ways, on the gateway's API for any host (no hyper).
//! `cargo run --example actix -- 127.0.0.1:8080 tokens.txt` (lines `<id> <token>`). actix-web 4
//! speaks `http` 0.2, the gateway `http` 1; no half-closed callers: one that hangs up aborts.
use actix_web::{http::StatusCode, web, App, HttpRequest, HttpResponse, HttpServer};
use worker_relay_hyper::gateway::{Gateway, GatewayBody, LetGo};
use worker_relay_hyper::worker_relay::connect::TokenTable;

fn headers(req: &HttpRequest) -> http::HeaderMap {
    let each = req.headers().iter();
    each.filter_map(|(k, v)| Some((k.as_str().parse().ok()?, v.as_bytes().try_into().ok()?)))
        .collect()
}

fn reply(resp: http::Response<GatewayBody>) -> HttpResponse {
    let mut out = HttpResponse::build(StatusCode::from_u16(resp.status().as_u16()).unwrap());
    for (k, v) in resp.headers() {
        let v = v.as_bytes().to_vec();
        _ = match *k {
            http::header::UPGRADE => out.upgrade(v), // a 101
            _ => out.append_header((k.as_str(), v)),
        };
    }
    out.streaming(resp.into_body().into_stream())
}

async fn connect(req: HttpRequest, body: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    match gw.admit(req.path(), &headers(&req), req.peer_addr()).await {
        Ok(admission) => reply(admission.upgrade_local(body, req.conn_data())),
        Err(refusal) => reply(refusal),
    }
}

async fn forward(req: HttpRequest, body: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    let mut head = http::Request::builder().uri(req.uri().to_string());
    _ = head.headers_mut().map(|h| *h = headers(&req)); // None: a bad URI (then 400)
    match head.method(req.method().as_str()).body(body) {
        Ok(head) => reply(gw.forward_local(head).await),
        Err(_) => HttpResponse::BadRequest().body("bad request\n"),
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect(); // LISTEN TOKENS_FILE
    let tokens = TokenTable::parse(&std::fs::read_to_string(&args[2])?).expect("a token file");
    let gateway = web::Data::new(Gateway::new(tokens));
    let server = HttpServer::new(move || {
        App::new()
            .app_data(gateway.clone())
            .route("/status", web::get().to(|| async { "fine" }))
            .route("/connect", web::get().to(connect))
            .default_service(web::to(forward))
    });
    let server = server.on_connect(|conn, ext| _ = LetGo::of(conn).map(|s| ext.insert(s)));
    let server = server.h1_allow_half_closed(false).bind(&args[1])?;
    eprintln!("listening on {}", server.addrs()[0]);
    server.run().await
}
