//! StatsD / DogStatsD input: datagrams through the line parser, and TCP byte streams through
//! the framer, under the default mapping and under rules that route, build keys from tags and
//! filter dimensions.
//!
//! Input: a flag byte (bit 0: the rule mapping; bits 1–7: where to cut the stream into TCP
//! reads), then the bytes. Asserts, beyond "no panic":
//! - every non-blank line of a datagram ends in exactly one outcome: an event or a drop with
//!   a non-empty reason; an event's line takes 6 bytes at least (`a:1|c` and a newline);
//! - an accepted event carries at most 16 dimensions, each a tag of its line, and a namespace
//!   the mapping names;
//! - the framer gives the same lines however the stream is cut into reads, never holds more
//!   than a line's worth, and keeps every line of at most 64 KiB.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tally_server::statsd::map::{Mapping, Rule};
use tally_server::statsd::tcp::{Framed, Framer, MAX_LINE_BYTES};
use tally_server::statsd::{Rng, parse_datagram};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else {
        return;
    };
    let map = if flags & 1 == 0 {
        Mapping::default()
    } else {
        Mapping::new(
            Rule::new("", "statsd", "{name}", None).expect("rule"),
            vec![
                Rule::new("a", "api", "{rest}.{tag:org}", Some(vec!["status".into()]))
                    .expect("rule"),
                Rule::new("", "web", "x{{{tag:site}}}", None).expect("rule"),
            ],
        )
    };
    let namespaces = map.namespaces();

    let lines = bytes
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty())
        .count();
    let (mut events, mut dropped) = (Vec::new(), 0usize);
    parse_datagram(bytes, &map, &mut Rng::new(1), &mut events, &mut |d| {
        assert!(!d.reason.is_empty());
        dropped += 1;
    });
    assert_eq!(events.len() + dropped, lines);
    assert!(
        events.len() * 6 <= bytes.len() + 1,
        "{} events in {} bytes",
        events.len(),
        bytes.len()
    );
    for e in &events {
        assert!(e.dims.len() <= 16, "{e:?}");
        assert!(namespaces.contains(&e.ns.as_str()), "{e:?}");
    }

    // The framer: whole stream at once against reads cut every `step` bytes.
    let step = usize::from(flags >> 1).max(1);
    let frame = |cut: usize| {
        let mut f = Framer::default();
        let mut out: Vec<Option<Vec<u8>>> = Vec::new();
        for chunk in bytes.chunks(cut) {
            f.feed(chunk, &mut |x| match x {
                Framed::Line(l) => {
                    assert!(l.len() <= MAX_LINE_BYTES);
                    out.push(Some(l.to_vec()));
                }
                Framed::TooLong => out.push(None),
            });
        }
        (out, f.unfinished())
    };
    let whole = frame(bytes.len().max(1));
    assert_eq!(frame(step), whole);
    let complete: Vec<&[u8]> = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(last) => bytes[..last].split(|&b| b == b'\n').collect(),
        None => Vec::new(),
    };
    let mut want: Vec<Option<Vec<u8>>> = complete
        .iter()
        .map(|l| (l.len() <= MAX_LINE_BYTES).then(|| l.to_vec()))
        .collect();
    let tail = bytes
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(bytes, |i| &bytes[i + 1..]);
    if tail.len() > MAX_LINE_BYTES {
        want.push(None);
    }
    assert_eq!(whole.0, want);
});
