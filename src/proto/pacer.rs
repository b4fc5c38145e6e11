//! How much to commit below the scheduler: a chunk size that follows the
//! rate at which the socket drains.
//!
//! The scheduler ([`RelayConnection`](super::RelayConnection) and
//! [`WorkerConnection`](super::WorkerConnection)) sends control frames first
//! and interleaves body chunks of different streams, but that order only
//! reaches the wire if little sits below it: once a chunk has been handed to
//! the socket, a `response` head or a cancel's answer waits for all of it.
//! On loopback a 1 MiB chunk is a fraction of a millisecond; on a 2 Mbit/s
//! uplink it is four seconds. So the driver hands the socket at most one
//! chunk's worth of messages between two completed flushes, and the chunk
//! size follows what the socket drained while it was the bottleneck:
//! [`TARGET`] of data at that rate, between [`MIN_CHUNK`] and the
//! configured `chunk_size` (1 MiB by default).
//!
//! [`SendPacer`] is sans-IO like the machines: the driver reports what it
//! sees of its socket (bytes handed over, a write that had to wait, a flush
//! that completed) with the time, and feeds
//! [`SendPacer::chunk_size`] to the machine's `set_chunk_size`. A fast link
//! never makes the socket wait: each time two chunks and [`ABSORB`] went
//! without a wait, at least as fast as the doubled chunk's rate, the chunk
//! doubles, so loopback keeps 1 MiB chunks; a new connection starts at
//! [`MIN_CHUNK`], the way TCP starts with a small window.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use worker_relay::proto::pacer::{SendPacer, MIN_CHUNK};
//! # let _ = MIN_CHUNK;
//!
//! let mut pacer = SendPacer::new(1 << 20);
//! let t0 = Instant::now();
//! assert_eq!(pacer.chunk_size(), MIN_CHUNK);
//! // 10 Mbit/s: each 8 KiB batch waits on the socket for 6.5 ms.
//! let mut now = t0;
//! for _ in 0..20 {
//!     pacer.on_sent(8192, now);
//!     pacer.on_blocked();
//!     now += Duration::from_micros(6_554);
//!     pacer.on_flushed(now);
//! }
//! // 4 ms of 1.25 MB/s.
//! assert!((4_900..=5_100).contains(&pacer.chunk_size()));
//! ```

use std::time::{Duration, Instant};

/// The smallest chunk the pacer chooses: 2 KiB (8 ms at 2 Mbit/s, under
/// 2 ms at 10, where 4 ms of data is larger anyway). Below it the
/// per-message costs (a WebSocket header, a stream id, a wake-up) start to
/// count; above it a 2 Mbit/s uplink keeps a cancel's answer waiting
/// longer: with 4 KiB, /health took 87 ms during a download there, with 2
/// KiB 50 ms (BENCHMARKS.md, "On a slow link").
pub const MIN_CHUNK: usize = 2 << 10;

/// How much time of data a chunk holds at the measured rate: 4 ms.
pub const TARGET: Duration = Duration::from_millis(4);

/// The weight of a sample that raises the smoothed rate: 1/4 (one that
/// lowers it: 3/4).
const GAIN_DENOM: u64 = 4;

/// The shortest stretch of sending a rate sample covers. What the socket
/// holds below us rises and falls by up to its low-water mark between two
/// flushes; over a longer stretch, and smoothed, that evens out.
pub const SAMPLE_SPAN: Duration = Duration::from_millis(16);

/// What a socket takes without a wait whatever its link: 64 KiB (a
/// low-water mark of unsent bytes, and a segment being built). Bytes
/// flushed without a wait say the link is fast only past this much.
pub const ABSORB: usize = 64 << 10;

/// A drain-rate estimate and the chunk size it gives (see the module docs).
#[derive(Debug, Clone)]
pub struct SendPacer {
    max: usize,
    min: usize,
    chunk: usize,
    /// Smoothed drain rate, bytes per second (0: no sample yet).
    rate: u64,
    /// Bytes handed to the socket since the last completed flush.
    unflushed: usize,
    /// Whether the socket made us wait since the last completed flush.
    batch_blocked: bool,
    /// Bytes flushed without a wait since the socket last made us wait,
    /// and when the first of them was handed over.
    free_run: usize,
    free_start: Option<Instant>,
    /// When the batch in flight started.
    batch_start: Option<Instant>,
    /// The stretch of sending being measured: when it started, the bytes
    /// flushed in it, and whether the socket made us wait in it.
    window: Option<(Instant, usize, bool)>,
    /// When a flush last completed.
    last_flush: Option<Instant>,
}

impl SendPacer {
    /// A pacer for a connection whose chunks may be up to `max` bytes (the
    /// machine's configured `chunk_size`). It starts at
    /// [`MIN_CHUNK`] (or `max`, if smaller).
    pub fn new(max: usize) -> SendPacer {
        let max = max.max(1);
        let min = MIN_CHUNK.min(max);
        SendPacer {
            max,
            min,
            chunk: min,
            rate: 0,
            unflushed: 0,
            batch_blocked: false,
            free_run: 0,
            free_start: None,
            batch_start: None,
            window: None,
            last_flush: None,
        }
    }

    /// The chunk size to use now, and the most to hand the socket between
    /// two completed flushes (one message may go past it).
    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// The smoothed drain rate in bytes per second, once known (`None`
    /// before the first sample).
    pub fn rate(&self) -> Option<u64> {
        (self.rate > 0).then_some(self.rate)
    }

    /// Bytes handed to the socket since the last completed flush.
    pub fn unflushed(&self) -> usize {
        self.unflushed
    }

    /// Whether the batch in flight has reached the chunk size: flush
    /// before handing over more.
    pub fn batch_full(&self) -> bool {
        self.unflushed >= self.chunk
    }

    /// `n` bytes (one message) were handed to the socket at `now`.
    pub fn on_sent(&mut self, n: usize, now: Instant) {
        self.on_sent_at(n, || now);
    }

    /// [`on_sent`](Self::on_sent), the clock read only if the time is
    /// needed: by the first message of a batch (the rest of the batch goes
    /// without a reading, as one sender's many small answers do).
    pub fn on_sent_at(&mut self, n: usize, clock: impl FnOnce() -> Instant) {
        if self.window.is_some() && self.unflushed > 0 {
            self.unflushed = self.unflushed.saturating_add(n);
            return;
        }
        let now = clock();
        if self.window.is_none() {
            self.window = Some((now, 0, false));
            if self
                .last_flush
                .is_some_and(|t| now.saturating_duration_since(t) >= SAMPLE_SPAN)
            {
                // After a pause, what went without a wait before it says
                // nothing about the link now: small answers trickling over
                // a slow link must not add up to a "fast" verdict.
                self.reset_free_run();
            }
        }
        if self.unflushed == 0 {
            self.batch_start = Some(now);
        }
        self.unflushed = self.unflushed.saturating_add(n);
    }

    /// The socket made us wait (a write or a flush was not ready).
    pub fn on_blocked(&mut self) {
        self.reset_free_run();
        if self.unflushed > 0 {
            self.batch_blocked = true;
        }
        if let Some((_, _, blocked)) = self.window.as_mut() {
            *blocked = true;
        }
    }

    /// A flush completed at `now`: everything handed over is below us.
    /// Updates the chunk size.
    pub fn on_flushed(&mut self, now: Instant) {
        let n = std::mem::take(&mut self.unflushed);
        self.last_flush = Some(now);
        let batch_start = self.batch_start.take();
        if std::mem::take(&mut self.batch_blocked) {
            self.reset_free_run();
        } else {
            self.free_run = self.free_run.saturating_add(n);
            let start = *self.free_start.get_or_insert(batch_start.unwrap_or(now));
            let doubled = self.chunk.saturating_mul(2).min(self.max);
            if self.free_run >= self.chunk.saturating_mul(2).saturating_add(ABSORB)
                && pace(self.free_run, now.saturating_duration_since(start)) >= rate_for(doubled)
            {
                // Two chunks went without a wait, past what any socket
                // takes at once, and fast: the link is not the limit at
                // this size. Grow, as TCP's slow start does. (A trickle of
                // small answers that never fills a slow link is not fast.)
                self.reset_free_run();
                self.chunk = doubled;
                self.rate = self.rate.max(rate_for(self.chunk));
            }
        }
        let Some((start, bytes, blocked)) = self.window.as_mut() else {
            return;
        };
        *bytes = bytes.saturating_add(n);
        let elapsed = now.saturating_duration_since(*start);
        if !*blocked || elapsed < SAMPLE_SPAN {
            return;
        }
        let sample =
            u128::try_from(*bytes).unwrap_or(u128::MAX) * 1_000_000_000 / elapsed.as_nanos().max(1);
        let sample = u64::try_from(sample).unwrap_or(u64::MAX);
        *start = now;
        *bytes = 0;
        *blocked = false;
        // Quick down (a quarter of the old rate stays), slow up (a quarter
        // of the sample is taken): a link that slows down commits little
        // before the chunk follows it; one jittery sample up changes little.
        self.rate = match self.rate {
            0 => sample,
            r if sample < r => (r / GAIN_DENOM).saturating_add(sample / GAIN_DENOM * 3),
            r => (r / GAIN_DENOM * 3).saturating_add(sample / GAIN_DENOM),
        };
        let target = u128::from(self.rate) * TARGET.as_nanos() / 1_000_000_000;
        self.chunk = usize::try_from(target)
            .unwrap_or(usize::MAX)
            .clamp(self.min, self.max);
    }

    fn reset_free_run(&mut self) {
        self.free_run = 0;
        self.free_start = None;
    }

    /// The driver has nothing more to send: the stretch being measured
    /// ends (time spent waiting for the application says nothing about
    /// the link).
    pub fn on_idle(&mut self) {
        if self.unflushed == 0 {
            self.window = None;
        }
    }
}

/// Bytes per second of `bytes` over `elapsed` (a zero time counts as 1 ns).
fn pace(bytes: usize, elapsed: Duration) -> u64 {
    let r = bytes as u128 * 1_000_000_000 / elapsed.as_nanos().max(1);
    u64::try_from(r).unwrap_or(u64::MAX)
}

/// The rate at which `chunk` bytes are [`TARGET`] of data.
fn rate_for(chunk: usize) -> u64 {
    let r = chunk as u128 * 1_000_000_000 / TARGET.as_nanos();
    u64::try_from(r).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends batches of the pacer's chunk size through a link of `rate`
    /// bytes/s for `rounds`; every batch waits on the socket.
    fn through_link(p: &mut SendPacer, now: &mut Instant, rate: u64, rounds: usize) {
        for _ in 0..rounds {
            let n = p.chunk_size();
            p.on_sent(n, *now);
            p.on_blocked();
            *now += Duration::from_nanos(n as u64 * 1_000_000_000 / rate);
            p.on_flushed(*now);
        }
    }

    /// Batches of the chunk size, each flushed at once, until the chunk
    /// is 1 MiB; fails past `limit` bytes.
    fn grow_unhindered(p: &mut SendPacer, now: &mut Instant, limit: usize) {
        let mut sent = 0;
        while p.chunk_size() < 1 << 20 {
            assert!(sent < limit, "{sent} bytes sent, chunk {}", p.chunk_size());
            let n = p.chunk_size();
            p.on_sent(n, *now);
            sent += n;
            *now += Duration::from_micros(10);
            p.on_flushed(*now);
        }
    }

    #[test]
    fn a_fast_socket_grows_the_chunk_to_its_maximum() {
        let mut p = SendPacer::new(1 << 20);
        let mut now = Instant::now();
        assert_eq!(p.chunk_size(), MIN_CHUNK);
        // Two unhindered chunks past what a socket takes at once double it:
        // 2 KiB to 1 MiB within 3 MiB.
        grow_unhindered(&mut p, &mut now, 3 << 20);
        assert!(p.rate().is_some());
    }

    #[test]
    fn a_slow_link_keeps_chunks_a_few_milliseconds_long() {
        for (mbit, expect) in [(2u64, MIN_CHUNK), (10, 5_000), (40, 20_000), (200, 100_000)] {
            let rate = mbit * 1_000_000 / 8;
            let mut p = SendPacer::new(1 << 20);
            let mut now = Instant::now();
            through_link(&mut p, &mut now, rate, 200);
            let chunk = p.chunk_size();
            assert!(
                chunk >= expect * 9 / 10 && chunk <= (expect * 11 / 10).max(MIN_CHUNK),
                "{mbit} Mbit/s: chunk {chunk}, expected about {expect}"
            );
            let est = p.rate().unwrap();
            assert!(
                est.abs_diff(rate) < rate / 10,
                "{mbit}: rate {est} vs {rate}"
            );
        }
    }

    #[test]
    fn a_link_that_slows_down_shrinks_the_chunk_and_one_that_speeds_up_grows_it() {
        let mut p = SendPacer::new(1 << 20);
        let mut now = Instant::now();
        // A fast link that still makes us wait (a slow reader on loopback):
        // one sample span of small chunks, then the largest.
        through_link(&mut p, &mut now, 1 << 30, 9000);
        assert_eq!(p.chunk_size(), 1 << 20);
        // 10 Mbit/s: down to the floor within a few samples, so that little
        // is committed meanwhile.
        let start = now;
        through_link(&mut p, &mut now, 1_250_000, 12);
        assert!(p.chunk_size() <= 6_000, "{}", p.chunk_size());
        assert!(
            now - start < Duration::from_millis(2500),
            "{:?}",
            now - start
        );
        // Faster again: unblocked flushes double it back within 4 MiB.
        grow_unhindered(&mut p, &mut now, 4 << 20);
    }

    #[test]
    fn an_application_slower_than_the_socket_gets_chunks_of_its_own_pace() {
        // On loopback the driver often runs dry (the app computes its body):
        // idle gaps between unhindered batches do not hold the chunk back,
        // and the chunk is 4 ms of what the app makes.
        for (per_ms, expect) in [(512usize << 10, 1 << 20), (64 << 10, 256 << 10)] {
            let mut p = SendPacer::new(1 << 20);
            let mut now = Instant::now();
            for _ in 0..400 {
                for _ in 0..4 {
                    p.on_sent(per_ms / 4, now);
                    p.on_flushed(now);
                }
                p.on_idle();
                now += Duration::from_millis(1);
            }
            assert_eq!(p.chunk_size(), expect, "{per_ms} bytes a millisecond");
        }
    }

    #[test]
    fn what_a_socket_takes_at_once_does_not_grow_the_chunk() {
        // A slow link under a 16 KiB low-water mark: after each wait the
        // socket takes two batches at once, then makes us wait again.
        let mut p = SendPacer::new(1 << 20);
        let mut now = Instant::now();
        for _ in 0..200 {
            for _ in 0..2 {
                p.on_sent(p.chunk_size(), now);
                p.on_flushed(now);
            }
            let n = p.chunk_size();
            p.on_sent(n, now);
            p.on_blocked();
            now += Duration::from_nanos(3 * n as u64 * 800);
            p.on_flushed(now);
        }
        // 4 ms of 1.25 MB/s, not the doubling that two free batches would
        // give without the allowance.
        assert!(p.chunk_size() <= 5_100, "{}", p.chunk_size());
    }

    #[test]
    fn small_answers_spread_over_time_do_not_grow_the_chunk() {
        // /health answers, 200 bytes each, 100 ms apart, for ten minutes on
        // a slow link: never two chunks' worth within a burst.
        let mut p = SendPacer::new(1 << 20);
        let mut now = Instant::now();
        for _ in 0..6000 {
            p.on_sent(200, now);
            p.on_flushed(now);
            p.on_idle();
            now += Duration::from_millis(100);
        }
        assert_eq!(p.chunk_size(), MIN_CHUNK);
    }

    #[test]
    fn a_steady_trickle_below_the_link_rate_does_not_grow_the_chunk() {
        // 500 bytes every 5 ms (100 KB/s) on a slow link that never makes
        // us wait at that pace, for a minute; then a bulk transfer starts:
        // its first chunks stay small.
        let mut p = SendPacer::new(1 << 20);
        let mut now = Instant::now();
        for _ in 0..12_000 {
            p.on_sent(500, now);
            p.on_flushed(now);
            p.on_idle();
            now += Duration::from_millis(5);
        }
        assert_eq!(p.chunk_size(), MIN_CHUNK);
    }

    #[test]
    fn idle_time_is_not_counted_as_link_time() {
        // 10 Mbit/s, with the application pausing 50 ms between bursts of
        // 64 KiB: the estimate is the link's rate, not the burst's.
        let mut p = SendPacer::new(1 << 20);
        let mut now = Instant::now();
        for _ in 0..20 {
            for _ in 0..16 {
                p.on_sent(MIN_CHUNK, now);
                p.on_blocked();
                now += Duration::from_nanos(MIN_CHUNK as u64 * 800);
                p.on_flushed(now);
            }
            p.on_idle();
            now += Duration::from_millis(50);
        }
        let rate = p.rate().unwrap();
        assert!(rate.abs_diff(1_250_000) < 125_000, "{rate}");
    }

    #[test]
    fn small_maximum_and_odd_inputs() {
        let mut p = SendPacer::new(100);
        assert_eq!(p.chunk_size(), 100);
        let now = Instant::now();
        // A flush with nothing sent, a block with nothing sent, a zero-time
        // batch: no panic, no change below the bounds.
        p.on_flushed(now);
        p.on_blocked();
        p.on_sent(50, now);
        p.on_blocked();
        p.on_flushed(now);
        assert_eq!(p.chunk_size(), 100);
        let mut p = SendPacer::new(0);
        assert_eq!(p.chunk_size(), 1);
        p.on_sent(usize::MAX / 2, now);
        p.on_blocked();
        p.on_flushed(now + Duration::from_secs(1));
        assert_eq!(p.chunk_size(), 1);
    }

    #[test]
    fn a_batch_is_full_at_the_chunk_size() {
        let mut p = SendPacer::new(1 << 20);
        let now = Instant::now();
        assert!(!p.batch_full());
        p.on_sent(100, now);
        assert!(!p.batch_full());
        p.on_sent(MIN_CHUNK, now);
        assert!(p.batch_full());
        assert_eq!(p.unflushed(), MIN_CHUNK + 100);
        p.on_flushed(now);
        assert_eq!(p.unflushed(), 0);
    }

    #[test]
    fn the_clock_is_read_once_a_batch_and_the_pacer_ends_the_same() {
        // Batches of 1 to 6 messages of 1 KiB to 40 KiB, some waiting on
        // the socket, some after a pause: each message told at its own
        // time to one pacer, and with a clock to the other.
        let (mut told, mut lazy) = (SendPacer::new(1 << 20), SendPacer::new(1 << 20));
        let mut now = Instant::now();
        let (mut reads, mut batches) = (0, 0);
        for round in 0..200usize {
            batches += 1;
            for m in 0..1 + round % 6 {
                let n = 1024 * (1 + (round * 7 + m * 13) % 40);
                now += Duration::from_micros(3);
                told.on_sent(n, now);
                lazy.on_sent_at(n, || {
                    reads += 1;
                    now
                });
            }
            if round % 5 == 0 {
                told.on_blocked();
                lazy.on_blocked();
            }
            now += Duration::from_micros(if round % 9 == 0 { 60_000 } else { 200 });
            told.on_flushed(now);
            lazy.on_flushed(now);
            if round % 4 == 0 {
                told.on_idle();
                lazy.on_idle();
            }
            assert_eq!(format!("{told:?}"), format!("{lazy:?}"), "round {round}");
        }
        assert_eq!(reads, batches);
        assert!(told.chunk_size() > MIN_CHUNK, "the sequence grew the chunk");
    }
}
