//! One log record's payload through `wal::payload::decode`, the decoder recovery runs on
//! every record.
//!
//! Asserts, beyond "no panic": what decodes names only strings of its own table and
//! subtotal ranges inside its own list, and re-encodes to bytes that decode to the same
//! value (batches and schema changes alike).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tally_engine::wal::payload::{Payload, decode, encode_schema};

fuzz_target!(|data: &[u8]| {
    let Ok(payload) = decode(data) else {
        return;
    };
    let mut again = Vec::new();
    match &payload {
        Payload::Batch(view) => {
            let strings = view.strings.len();
            for &(ns, _) in &view.creates {
                assert!((ns as usize) < strings);
            }
            let mut next_sub = 0;
            for inc in &view.incs {
                assert!((inc.ns as usize) < strings && (inc.key as usize) < strings);
                // Each increment's subtotals follow the previous one's, in order.
                assert_eq!(inc.subs.0, next_sub);
                assert!(inc.subs.0 <= inc.subs.1 && inc.subs.1 as usize <= view.subs.len());
                next_sub = inc.subs.1;
                for &(d, v) in view.subs_of(inc) {
                    assert!((d as usize) < strings && (v as usize) < strings);
                }
            }
            assert_eq!(next_sub as usize, view.subs.len());
            view.encode(&mut again);
        }
        Payload::Schema(ns, schema) => encode_schema(ns, schema, &mut again),
    }
    assert_eq!(
        decode(&again).as_ref(),
        Ok(&payload),
        "re-encoded: {again:?}"
    );
});
