//! A process's CPU time from `/proc/<pid>/stat`, for the benches that run
//! the relay as a process.

use std::process::Command;

/// CPU seconds (user + system) the process has used so far.
pub fn cpu_seconds(pid: u32) -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let hz = *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    let field = |i: usize| {
        rest.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(11) + field(12)) / hz
}
