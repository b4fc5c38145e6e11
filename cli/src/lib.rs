//! The relay and the worker of the [Worker Relay Protocol] as programs:
//! what the binary `worker-relay` runs (`worker-relay relay …`,
//! `worker-relay worker …`), and what the repository's examples `relay` and
//! `worker` run too (each a few lines calling [`relay::main`] or
//! [`worker::main`]).
//!
//! This library exists for those programs (and the repository's demo,
//! tests and benchmarks, which share the worker's app and the log); it is
//! not an API to build on: use the crates `worker-relay` and
//! `worker-relay-hyper` for that.
//!
//! [Worker Relay Protocol]: https://docs.rs/worker-relay

pub mod relay;
pub mod worker;

pub mod logging;
pub mod worker_app;

mod admin;
mod runtime;
mod secrets;
mod shutdown;
mod tunnel_upstream;
