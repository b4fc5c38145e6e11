//! Errors and ends of this crate's components: what each call returns.
//! The core's layers (`frame`, `proto`, `connect`, `rt`), and how one
//! failure looks from each of them and in the gateway's answer and access
//! log, are on [the core's page](worker_relay::errors). This page is
//! documentation only; the types live in their modules.
//!
//! | layer | call | on failure, or at its end | what the value says |
//! |---|---|---|---|
//! | `ws` | [`dial`](crate::ws::dial) | [`DialError`](crate::ws::DialError) | a [`Verdict`](worker_relay::connect::Verdict) and its cause (DNS, TCP, TLS, the relay's HTTP answer, a time limit) |
//! | `gateway` | [`Gateway::attach`](crate::gateway::Gateway::attach) | `Result<`[`Closed`](worker_relay::rt::Closed)`, `[`AttachError`](crate::gateway::AttachError)`<E>>` | as a driver's end, or `Duplicate`: refused, the worker is connected already |
//! | `gateway` | its services | never an `Err` | every failure is an HTTP answer (the core's page maps each to its cause) and one access-log line with its `end` |
//! | `tunnel` | [`serve`](crate::tunnel::serve) | as an `rt` driver, `E` = the WebSocket's error | the connection's end |
//! | `tunnel` | [`Tunnel::run`](crate::tunnel::Tunnel::run), [`run_until`](crate::tunnel::Tunnel::run_until) | [`Refused`](worker_relay::connect::Refused), [`TunnelEnd`](crate::tunnel::TunnelEnd) | they retry everything else; they end only when the relay refuses the worker for good, or at the shutdown |
