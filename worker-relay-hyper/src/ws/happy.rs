//! The dial's TCP connection, Happy Eyeballs style (RFC 8305): the host's
//! addresses interleaved by family, a new attempt started every
//! [`ATTEMPT_DELAY`] (or as soon as one fails) while the earlier ones are
//! still pending, the first to connect kept and the others dropped. A
//! blackholed address (an AAAA record on a network without IPv6 routes)
//! then costs the dial 250 ms, not its whole time limit.

use super::dial::{DialError, Target};
use std::future::{poll_fn, Future};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// How long the dial waits for a connection attempt before it starts the
/// next one beside it (RFC 8305's "Connection Attempt Delay", whose
/// recommended value this is).
pub const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// Looks the host up and connects to its addresses, Happy Eyeballs style.
pub(super) async fn connect(target: &Target) -> Result<TcpStream, DialError> {
    let host = target.host.as_str();
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, target.port))
        .await
        .map_err(|e| DialError::network(format!("DNS lookup of {host} failed: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(DialError::network(format!(
            "DNS lookup of {host} found no address"
        )));
    }
    let tcp = race(interleave(addrs), ATTEMPT_DELAY, TcpStream::connect)
        .await
        .map_err(DialError::network)?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// The resolver's order (RFC 6724's preference), the families alternating
/// from the first address's (RFC 8305 §4, with a first-family count of 1).
pub(super) fn interleave(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let Some(first_v6) = addrs.first().map(SocketAddr::is_ipv6) else {
        return addrs;
    };
    let (first, other): (Vec<_>, Vec<_>) = addrs.into_iter().partition(|s| s.is_ipv6() == first_v6);
    let mut out = Vec::with_capacity(first.len() + other.len());
    let (mut first, mut other) = (first.into_iter(), other.into_iter());
    loop {
        match (first.next(), other.next()) {
            (None, None) => return out,
            (x, y) => out.extend(x.into_iter().chain(y)),
        }
    }
}

/// Connects to `addrs` in order with `connect`, starting the next attempt
/// when the newest one has been pending for `delay` or when an attempt
/// fails, while the pending ones go on. The first connection wins; the
/// pending attempts are dropped then. When all fail, the error names the
/// last failure.
pub(super) async fn race<T, F, Fut>(
    addrs: Vec<SocketAddr>,
    delay: Duration,
    mut connect: F,
) -> Result<T, String>
where
    F: FnMut(SocketAddr) -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    let mut next = addrs.into_iter().peekable();
    let mut pending: Vec<(SocketAddr, Pin<Box<Fut>>)> = Vec::new();
    let mut last_error: Option<String> = None;
    // Starts the next attempt at once: the first one, or after a failure.
    let mut start_now = true;
    let timer = tokio::time::sleep(delay);
    let mut timer = std::pin::pin!(timer);
    poll_fn(|cx| loop {
        let mut i = 0;
        while i < pending.len() {
            match pending[i].1.as_mut().poll(cx) {
                Poll::Ready(Ok(t)) => return Poll::Ready(Ok(t)),
                Poll::Ready(Err(e)) => {
                    last_error = Some(format!("connecting to {}: {e}", pending[i].0));
                    drop(pending.swap_remove(i));
                    start_now = true;
                }
                Poll::Pending => i += 1,
            }
        }
        if next.peek().is_none() {
            if pending.is_empty() {
                let why = last_error.take();
                return Poll::Ready(Err(why.unwrap_or_else(|| "no address to connect to".into())));
            }
            return Poll::Pending;
        }
        if start_now || pending.is_empty() || timer.as_mut().poll(cx).is_ready() {
            let addr = next.next().expect("peeked");
            pending.push((addr, Box::pin(connect(addr))));
            timer
                .as_mut()
                .reset(Instant::now() + delay.min(ATTEMPT_DELAY_MAX));
            start_now = false;
            // Poll the new attempt, and the timer for its new deadline.
            continue;
        }
        return Poll::Pending;
    })
    .await
}

/// The longest delay between attempts `race` takes (RFC 8305 §5: at most
/// 2 s); it also keeps `Instant + delay` far from overflowing.
const ATTEMPT_DELAY_MAX: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    use std::sync::{Arc, Mutex};

    fn v4(last: u8) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)), 80)
    }

    fn v6(last: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, last)), 80)
    }

    /// What each address does in the fake connector.
    #[derive(Clone, Copy)]
    enum Fate {
        /// A blackhole: the attempt never completes.
        Never,
        /// Refused after this long.
        FailAfter(u64),
        /// Connected after this long.
        ConnectAfter(u64),
    }

    /// A connector that logs when (on the paused clock) each attempt
    /// starts, and whether it was dropped unfinished.
    fn connector(
        fates: Vec<(SocketAddr, Fate)>,
        log: Arc<Mutex<Vec<(SocketAddr, Duration)>>>,
        dropped: Arc<Mutex<Vec<SocketAddr>>>,
    ) -> impl FnMut(SocketAddr) -> Pin<Box<dyn Future<Output = io::Result<SocketAddr>>>> {
        let start = Instant::now();
        move |addr| {
            log.lock().unwrap().push((addr, start.elapsed()));
            let fate = fates.iter().find(|(a, _)| *a == addr).unwrap().1;
            let guard = DropLog(Some(addr), dropped.clone());
            Box::pin(async move {
                let mut guard = guard;
                let r = match fate {
                    Fate::Never => std::future::pending().await,
                    Fate::FailAfter(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Err(io::Error::from(io::ErrorKind::ConnectionRefused))
                    }
                    Fate::ConnectAfter(ms) => {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        Ok(addr)
                    }
                };
                guard.0 = None;
                r
            })
        }
    }

    struct DropLog(Option<SocketAddr>, Arc<Mutex<Vec<SocketAddr>>>);

    impl Drop for DropLog {
        fn drop(&mut self) {
            if let Some(a) = self.0 {
                self.1.lock().unwrap().push(a);
            }
        }
    }

    type Run = (
        Result<SocketAddr, String>,
        Duration,
        Vec<(SocketAddr, Duration)>,
        Vec<SocketAddr>,
    );

    async fn run(fates: Vec<(SocketAddr, Fate)>) -> Run {
        let log = Arc::default();
        let dropped = Arc::default();
        let addrs = fates.iter().map(|(a, _)| *a).collect();
        let start = Instant::now();
        let c = connector(fates, Arc::clone(&log), Arc::clone(&dropped));
        // Bounded by the dial's default time limit (on paused time).
        let r = tokio::time::timeout(DIAL_LIMIT, race(addrs, ATTEMPT_DELAY, c))
            .await
            .unwrap_or_else(|_| Err("the dial's time limit passed".into()));
        let took = start.elapsed();
        let log = log.lock().unwrap().clone();
        let dropped = dropped.lock().unwrap().clone();
        (r, took, log, dropped)
    }

    const MS: fn(u64) -> Duration = Duration::from_millis;
    const DIAL_LIMIT: Duration = crate::ws::DIAL_TIMEOUT;

    #[tokio::test(start_paused = true)]
    async fn a_blackholed_first_address_costs_one_attempt_delay() {
        let (r, took, log, dropped) =
            run(vec![(v6(1), Fate::Never), (v4(1), Fate::ConnectAfter(10))]).await;
        assert_eq!(r, Ok(v4(1)));
        // The second attempt starts 250 ms in, and connects 10 ms later:
        // not after the dial's whole time limit (10 s) as one by one did.
        assert_eq!(log, vec![(v6(1), MS(0)), (v4(1), MS(250))]);
        assert_eq!(took, MS(260));
        // The loser, still pending, is dropped.
        assert_eq!(dropped, vec![v6(1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_starts_the_next_attempt_at_once() {
        let (r, took, log, _) = run(vec![
            (v6(1), Fate::FailAfter(30)),
            (v4(1), Fate::FailAfter(40)),
            (v6(2), Fate::ConnectAfter(5)),
        ])
        .await;
        assert_eq!(r, Ok(v6(2)));
        assert_eq!(log, vec![(v6(1), MS(0)), (v4(1), MS(30)), (v6(2), MS(70))]);
        assert_eq!(took, MS(75));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_to_connect_wins_and_the_slower_ones_are_dropped() {
        // The first attempt answers only after 400 ms; the second, started
        // at 250 ms, connects at 260 ms; the third is never started.
        let (r, took, log, dropped) = run(vec![
            (v4(1), Fate::ConnectAfter(400)),
            (v6(1), Fate::ConnectAfter(10)),
            (v4(2), Fate::ConnectAfter(0)),
        ])
        .await;
        assert_eq!(r, Ok(v6(1)));
        assert_eq!(took, MS(260));
        assert_eq!(log.len(), 2);
        assert_eq!(dropped, vec![v4(1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn all_failing_is_the_last_failure_and_blackholes_wait_for_the_caller() {
        let (r, _, _, _) = run(vec![
            (v4(1), Fate::FailAfter(1)),
            (v4(2), Fate::FailAfter(1)),
        ])
        .await;
        let why = r.unwrap_err();
        assert!(why.contains("connecting to 127.0.0.2:80"), "{why}");
        // Only blackholes: the race never ends by itself; the dial's time
        // limit ends it.
        let (r, took, log, _) = run(vec![(v4(1), Fate::Never), (v6(1), Fate::Never)]).await;
        assert_eq!(r, Err("the dial's time limit passed".into()));
        assert_eq!(took, DIAL_LIMIT);
        assert_eq!(log, vec![(v4(1), MS(0)), (v6(1), MS(250))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_huge_delay_does_not_overflow() {
        let log = Arc::default();
        let c = connector(
            vec![(v6(1), Fate::Never), (v4(1), Fate::ConnectAfter(0))],
            log,
            Arc::default(),
        );
        let r = tokio::time::timeout(DIAL_LIMIT, race(vec![v6(1), v4(1)], Duration::MAX, c)).await;
        assert_eq!(r.ok(), Some(Ok(v4(1))));
    }

    /// A loopback address that takes no connection: a listener with a
    /// backlog of 0 whose queue is full drops new SYNs (the client waits
    /// as for an address whose packets go nowhere), checked before use.
    async fn blackhole() -> (socket2::Socket, Vec<std::net::TcpStream>, SocketAddr) {
        use socket2::{Domain, Socket, Type};
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        listener.bind(&any.into()).unwrap();
        listener.listen(0).unwrap();
        let addr = listener.local_addr().unwrap().as_socket().unwrap();
        let mut queued = Vec::new();
        for _ in 0..8 {
            let attempt = tokio::time::timeout(MS(300), TcpStream::connect(addr)).await;
            match attempt {
                Ok(tcp) => queued.push(tcp.unwrap().into_std().unwrap()),
                Err(_) => return (listener, queued, addr),
            }
        }
        panic!("the full listener at {addr} still took connections");
    }

    #[tokio::test]
    async fn a_real_blackholed_address_does_not_hold_the_dial() {
        let (_hole, _queued, hole) = blackhole().await;
        let good = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good_addr = good.local_addr().unwrap();
        // One address after the other, the dial would wait on the blackhole
        // until its time limit (or the kernel's SYN retries, some two
        // minutes); racing, the good one connects after 250 ms. The 5 s
        // bound is 20 times that, for a loaded machine.
        let dial = race(vec![hole, good_addr], ATTEMPT_DELAY, TcpStream::connect);
        let tcp = tokio::time::timeout(Duration::from_secs(5), dial)
            .await
            .expect("the dial waited on the blackholed address")
            .unwrap();
        assert_eq!(tcp.peer_addr().unwrap(), good_addr);
    }

    #[test]
    fn families_alternate_from_the_first_address() {
        let order = interleave(vec![v6(1), v6(2), v6(3), v4(1), v4(2)]);
        assert_eq!(order, vec![v6(1), v4(1), v6(2), v4(2), v6(3)]);
        let order = interleave(vec![v4(1), v4(2), v6(1)]);
        assert_eq!(order, vec![v4(1), v6(1), v4(2)]);
        assert_eq!(interleave(vec![]), vec![]);
    }
}
