//! The conformance kit's internals: the cases, the two modes' contexts,
//! the runner and the reports behind the `worker-relay-conformance`
//! binary, used by the kit's own tests (the crate's `tests/conformance.rs`
//! drives the modes against deliberately broken peers).
//!
//! **No stability promise**: this library is not an API. It changes with
//! every case added; depend on the binary (its command line, its JSON and
//! JUnit reports), not on these modules. See the README for the kit itself.

// The traits (`runner::Context`, `ws_send::WsSend`) are the kit's own, driven
// on its own runtime: no caller needs `Send` bounds on their futures.
#![allow(async_fn_in_trait)]

pub mod cli;
pub mod exec;
pub mod http;
pub mod junit;
pub mod kit;
pub mod relay_cases_caller;
pub mod relay_cases_conn;
pub mod relay_cases_faults;
pub mod relay_cases_http;
pub mod relay_cases_interactive;
pub mod relay_cases_slow;
pub mod relay_cases_token;
pub mod relay_cases_unread;
pub mod relay_ctx;
pub mod relay_observe;
pub mod report;
pub mod runner;
pub mod tcp_state;
pub mod worker_app_contract;
pub mod worker_cases_bounds;
pub mod worker_cases_conn;
pub mod worker_cases_interactive;
pub mod worker_cases_responses;
pub mod worker_cases_robust;
pub mod worker_cases_streams;
pub mod worker_ctx;
pub mod worker_observe;
pub mod ws_send;
