//! A loopback port nothing listens on, for the tests of a refused dial.

/// A port on 127.0.0.1 where nothing listens (a dial there is refused): a
/// listener on port 0, dropped at once.
///
/// For "connection refused" cases, where bind-and-drop is the one way to
/// get such a port. It cannot race harmfully: if another process takes
/// the port in between, the dial reaches that process instead, and the
/// test sees something other than a refusal and fails (to be re-run); it
/// cannot pass falsely, and no other test's server is disturbed (they all
/// bind port 0 themselves). The one server started on such a port is
/// nginx, which cannot listen on port 0: `tests/scaleout/nginx.rs` starts
/// it again on another port if it loses the race.
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
