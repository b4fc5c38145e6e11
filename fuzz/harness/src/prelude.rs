//! What the harness modules use: the crate's types and the std pieces,
//! imported once (`use crate::prelude::*;`).

#![allow(unused_imports)]
pub(crate) use crate::*;
pub(crate) use bytes::Bytes;
pub(crate) use std::collections::{BTreeMap, BTreeSet, VecDeque};
pub(crate) use std::sync::atomic::{AtomicBool, Ordering};
pub(crate) use std::sync::OnceLock;
pub(crate) use std::time::{Duration, Instant};
pub(crate) use worker_relay::connect::{
    decide_upgrade, Backoff, BackoffConfig, Rejected, Token, TokenTable, TokenTableError, UrlError,
    UrlMap, Verdict, WorkerId, MAX_PRESENTED_TOKEN, MIN_TABLE_TOKEN, SEC_WEBSOCKET_PROTOCOL,
};
pub(crate) use worker_relay::frame::{
    self, CloseCode, ControlFrame, Decoded, FrameError, HeadLimits, Headers, Message, RequestHead,
    ResponseHead, StreamId, MAX_CHUNK_BODY, MAX_MESSAGE_LEN, SUBPROTOCOL,
};
pub(crate) use worker_relay::proto::{
    is_control_route, BodyRead, FinishError, HandleError, KeepaliveConfig, OpenError, RelayConfig,
    RelayConnection, RelayEnd, RelayEvent, RespondError, StreamKey, UnknownStream, WorkerConfig,
    WorkerConnection, WorkerEnd, WorkerEvent, WriteError, MAX_PENDING_REFUSALS,
};
