//! The kernel's view of one of the kit's own TCP connections, read from
//! `/proc/net/tcp` and `/proc/net/tcp6` (Linux): whether the peer has sent
//! FIN or reset it, and how many received bytes the kit has not read.
//! Observed without reading the socket, so a peer blocked on its write to
//! the kit stays blocked.

use std::net::SocketAddr;

/// `st` in /proc/net/tcp (include/net/tcp_states.h).
pub const ESTABLISHED: u8 = 0x01;
pub const CLOSE: u8 = 0x07;
/// The peer sent FIN; the kit has not closed its end.
pub const CLOSE_WAIT: u8 = 0x08;

/// One connection's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub state: u8,
    /// Bytes sent and not acknowledged.
    pub tx_queue: u64,
    /// Bytes received and not read.
    pub rx_queue: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// No /proc/net/tcp here (not Linux, or not mounted).
    Unknown,
    /// The kernel has no such connection: reset (or fully closed).
    Gone,
    Found(Entry),
}

/// The connection from `local` to `peer` (matched by both ports).
pub fn lookup(local: SocketAddr, peer: SocketAddr) -> Seen {
    let mut any = false;
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        any = true;
        if let Some(e) = find(&text, local.port(), peer.port()) {
            return Seen::Found(e);
        }
    }
    if any {
        Seen::Gone
    } else {
        Seen::Unknown
    }
}

/// Parses the table's text (its header line first) for the connection
/// between ports `local` and `peer`.
pub fn find(table: &str, local: u16, peer: u16) -> Option<Entry> {
    let port = |addr: &str| {
        addr.rsplit_once(':')
            .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
    };
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 5 || port(f[1])? != local || port(f[2])? != peer {
            return None;
        }
        let (tx, rx) = f[4].split_once(':')?;
        Some(Entry {
            state: u8::from_str_radix(f[3], 16).ok()?,
            tx_queue: u64::from_str_radix(tx, 16).ok()?,
            rx_queue: u64::from_str_radix(rx, 16).ok()?,
        })
    })
}

pub fn state_name(state: u8) -> &'static str {
    match state {
        ESTABLISHED => "ESTABLISHED",
        0x02 => "SYN_SENT",
        0x04 => "FIN_WAIT1",
        0x05 => "FIN_WAIT2",
        0x06 => "TIME_WAIT",
        CLOSE => "CLOSE",
        CLOSE_WAIT => "CLOSE_WAIT",
        0x09 => "LAST_ACK",
        0x0B => "CLOSING",
        _ => "another state",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_line_by_both_ports() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1 0 20 4 30 10 -1\n   1: 0100007F:D431 0100007F:1F90 08 00000010:0001FFE0 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1\n";
        let e = find(table, 0xD431, 0x1F90).expect("found");
        assert_eq!(
            e,
            Entry {
                state: CLOSE_WAIT,
                tx_queue: 0x10,
                rx_queue: 0x1FFE0
            }
        );
        assert_eq!(find(table, 0x1F90, 0xD431).unwrap().state, ESTABLISHED);
        assert_eq!(find(table, 0xD431, 0x1F91), None);
    }

    #[test]
    fn sees_this_process_own_connection() {
        if !std::path::Path::new("/proc/net/tcp").exists() {
            return;
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        let (local, peer) = (c.local_addr().unwrap(), c.peer_addr().unwrap());
        match lookup(local, peer) {
            Seen::Found(e) => assert_eq!(e.state, ESTABLISHED),
            other => panic!("{other:?}"),
        }
        drop(s);
        // The peer's FIN arrives at once on loopback.
        let mut seen = None;
        for _ in 0..100 {
            if let Seen::Found(e) = lookup(local, peer) {
                if e.state == CLOSE_WAIT {
                    seen = Some(e.state);
                    break;
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(seen, Some(CLOSE_WAIT));
        drop(c);
    }
}
