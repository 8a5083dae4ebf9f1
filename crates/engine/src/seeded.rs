//! Hash seeds drawn once per process, for every table the engine keys by what a
//! client sends (key names, dimension names and values, idempotency keys) or chooses
//! (timestamps, and the ids of the keys and values it makes, in the order it makes them).
//!
//! With a seed written in the source (foldhash's `FixedState`, or a bare multiply), anyone
//! can compute, offline, names that all fall in one place of a table, and send them: every
//! look-up among them then walks all of them, and a few thousand such names cost a writer
//! a quadratic amount of work (HashDoS). Here the seed comes from foldhash's `RandomState`
//! (address-space layout, the clock, an allocation's address): where a name falls differs
//! from process to process, so it cannot be computed ahead. foldhash does not promise more
//! than that (a client who could measure look-up times over many requests might still
//! learn something); `std`'s SipHash would, at a cost on every look-up of the write path.
//!
//! What the engine answers does not follow a table's order, and nothing it reads back
//! depends on it: segment dictionaries number names as they come, reads sort or sum, and
//! `top` names every key tied at its cut. The one thing written in a table's order is an
//! answers file's records (`Answers::unwritten`), which now differ in order from run to
//! run; a file holds each key once and is loaded whole.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// The hasher of the engine's `HashMap`s and `HashSet`s: seeded per table, from a seed per
/// process.
pub(crate) type State = foldhash::fast::RandomState;

/// A `HashMap` hashed with [`State`].
pub(crate) type Map<K, V> = std::collections::HashMap<K, V, State>;

/// The process's seed for the tables that hash with a free function; 0 until first asked
/// (a plain read on every hash, the first time's work out of line).
static SEED: AtomicU64 = AtomicU64::new(0);

/// This process's seed for the tables that hash with a free function: the key index and
/// the interning table ([`hash_bytes`]), the counter table (see `entries::home`), and a
/// key's subtotal table once it has seen a long run (see `catalog::sub_home`). Never 0.
#[inline]
pub(crate) fn mix() -> u64 {
    match SEED.load(Ordering::Relaxed) {
        0 => first_seed(),
        seed => seed,
    }
}

#[cold]
#[inline(never)]
fn first_seed() -> u64 {
    let drawn = State::default().hash_one(0x0074_616c_6c79_u64) | 1;
    match SEED.compare_exchange(0, drawn, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => drawn,
        // Another thread drew first: every table takes its seed.
        Err(seed) => seed,
    }
}

/// A name of the counter or subtotal tables (an integer) mixed with `seed` into 64 bits
/// of hash: the name times a large odd constant to 128 bits, the halves folded and
/// multiplied again. The fold is what the seed needs: with one multiply, names a client
/// picked to collide without a seed still collide with one (xor shifts them all alike).
#[inline]
pub(crate) fn fold_mix(w: u64, seed: u64) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let p = u128::from(w ^ seed) * u128::from(K);
    ((p as u64) ^ ((p >> 64) as u64)).wrapping_mul(K)
}

/// The hash of a name's bytes, as the key index and the interning table hash them:
/// foldhash with this process's seed.
#[inline]
pub(crate) fn hash_bytes(b: &[u8]) -> u64 {
    foldhash::fast::FixedState::with_seed(mix()).hash_one(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names chosen because the source's fixed seed puts them all in one place of a table
    /// of 1 024 slots fall all over it here.
    #[test]
    fn names_that_collide_under_a_fixed_seed_spread_under_this_one() {
        let fixed = foldhash::fast::FixedState::default();
        let slot = |h: u64| h >> 54;
        let crafted: Vec<String> = (0..2_000_000u32)
            .map(|i| format!("key-{i}"))
            .filter(|name| slot(fixed.hash_one(name.as_bytes())) == 0)
            .take(300)
            .collect();
        assert_eq!(crafted.len(), 300, "enough names found to collide");
        let mut slots: Vec<u64> = crafted
            .iter()
            .map(|n| slot(hash_bytes(n.as_bytes())))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        // 300 names thrown at random into 1 024 slots land in ~260 different ones.
        assert!(slots.len() > 200, "only {} slots", slots.len());
    }

    #[test]
    fn one_process_hashes_a_name_one_way() {
        assert_eq!(hash_bytes(b"country"), hash_bytes(b"country"));
        assert_eq!(mix(), mix());
    }
}
