//! Counts in the examples' log lines: `1 worker`, `2 workers`.
#![allow(dead_code)] // shared by several examples, each using a part

/// `n` and `noun`, the noun in the plural (an `s` added) unless `n` is 1.
/// For the examples' regular nouns (worker, request, connection, line).
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
