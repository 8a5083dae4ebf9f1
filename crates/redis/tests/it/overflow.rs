//! Counters are 64-bit and wrap past 2^63 - 1, in Redis as in the engine and the reference
//! store: `HINCRBY` refuses such an increment, and the script used to stop there, leaving
//! the batch's later fields (a subtotal, the next key) unapplied.

use tally_core::ingest::Defaults;
use tally_core::model::Namespace;
use tally_core::store::Store;
use tally_redis::testing::RedisServer;

use crate::{batch, raw, read_all, schema, with_reference};

/// The largest amount an event may carry.
const MAX: i64 = (1 << 53) - 1;

#[test]
fn a_counter_past_64_bits_wraps_and_the_batch_applies_whole() {
    let server = RedisServer::start();
    let (redis, reference, now) = with_reference(&server.url());
    let ns = Namespace::new("m").unwrap();
    let stores: [&dyn Store; 2] = [&redis, &reference];
    // 1 000 events of the largest amount: just under 2^63. Then 100 more push past it
    // (and the next key in the same batch must count too); then 3 000 of the most negative
    // push below -2^63.
    let rounds: [(i64, usize); 3] = [(MAX, 1000), (MAX, 100), (-MAX, 3000)];
    for s in stores {
        s.put_schema(&ns, &schema(&["1m:48h", "1h:forever"], Some(&["1m", "1h"])))
            .unwrap();
        for (n, events) in rounds {
            let mut raws: Vec<_> = (0..events)
                .map(|_| raw("m", "big", now - 30, n, &[("status", "200")]))
                .collect();
            raws.push(raw("m", "next", now - 30, 1, &[("status", "200")]));
            s.apply(&batch(s, now, &raws, &Defaults::default()))
                .unwrap();
        }
    }
    let mut want = 0i64;
    for (n, events) in rounds {
        for _ in 0..events {
            want = want.wrapping_add(n);
        }
    }
    assert_eq!(
        want,
        MAX.wrapping_mul(1100).wrapping_sub(MAX.wrapping_mul(3000))
    );
    for res in [60, 3600] {
        let got = read_all(&redis, "m", "big", res).unwrap();
        assert_eq!(got.totals.len(), 1, "{got:?}");
        assert_eq!(got.totals[0].1, want, "the total at {res} s");
        assert_eq!(got.subtotals.len(), 1, "{got:?}");
        assert_eq!(
            got.subtotals[0].buckets[0].1, want,
            "the subtotal at {res} s"
        );
        assert_eq!(got, read_all(&reference, "m", "big", res).unwrap());
        let next = read_all(&redis, "m", "next", res).unwrap();
        assert_eq!(
            next.totals[0].1, 3,
            "the key after the overflow, at {res} s"
        );
    }
}
