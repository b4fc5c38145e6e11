//! Maps keyed by numbers this side hands out itself ([`StreamKey`]s, the
//! relay's stream ids): a multiplicative hash instead of SipHash. A peer
//! cannot choose these keys, so it cannot make them collide; maps keyed by
//! ids the peer chooses (the worker's) keep the standard library's keyed
//! hasher.
//!
//! [`StreamKey`]: super::StreamKey

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map whose keys this side chose.
pub(crate) type LocalMap<K, V> = HashMap<K, V, BuildHasherDefault<LocalHasher>>;

/// 2⁶⁴ / φ: multiplying by it spreads consecutive numbers over every bit.
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// The hasher of a [`LocalMap`] (Fx-style: rotate, xor, multiply).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LocalHasher(u64);

impl Hasher for LocalHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_keys_differ_in_their_high_bits() {
        // hashbrown takes its 7-bit tag from the top of the hash: consecutive
        // keys must not all share it.
        let b = BuildHasherDefault::<LocalHasher>::default();
        let tags: std::collections::HashSet<u64> =
            (1..=128u64).map(|k| b.hash_one(k) >> 57).collect();
        assert!(tags.len() > 64, "{} distinct tags", tags.len());
    }

    #[test]
    fn consecutive_keys_spread_over_the_buckets() {
        // hashbrown picks the bucket from the low bits: 4,096 consecutive
        // keys in 4,096 buckets must not pile up (a constant or identity-like
        // hash would put them all in a few).
        let b = BuildHasherDefault::<LocalHasher>::default();
        let mut load = vec![0u32; 4096];
        for k in 1..=4096u64 {
            load[(b.hash_one(k) & 4095) as usize] += 1;
        }
        let worst = load.iter().max().copied().unwrap_or(0);
        assert!(worst <= 8, "a bucket holds {worst} of 4,096 keys");
    }

    #[test]
    fn a_local_map_works_as_a_map() {
        let mut m: LocalMap<u64, u64> = LocalMap::default();
        for k in 0..10_000 {
            m.insert(k, k * 2);
        }
        assert!((0..10_000).all(|k| m[&k] == k * 2));
    }
}
