//! The StatsD line format: a datagram (or a TCP stream's lines) into events, each line alone.

use tally_core::ingest::{self, Defaults, IngestError, Limits};
use tally_core::model::{AMOUNT_LIMIT, MAX_DIMS_PER_EVENT, RawEvent};
use tally_core::store::{Batch, Store, StoreError};

use super::map::Mapping;
use super::{Dropped, MAX_TAGS_PER_LINE, Outcome};

/// splitmix64: small, fast, and good enough to round sample rates without bias.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Parses one datagram: each line becomes an event in `out` (where `map` says), or is passed to
/// `dropped` with its reason.
pub fn parse_datagram(
    datagram: &[u8],
    map: &Mapping,
    rng: &mut Rng,
    out: &mut Vec<RawEvent>,
    dropped: &mut dyn FnMut(Dropped),
) {
    for line in datagram.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        match parse_line(line, map, rng) {
            Ok(raw) => out.push(raw),
            Err(d) => dropped(d),
        }
    }
}

/// Parses one line (without its newline) into an event where `map` says. Only the format is
/// checked here; the API's rules (key, dimensions, allow-list, timestamp) are [`prepare_lines`]'s.
pub fn parse_line(line: &[u8], map: &Mapping, rng: &mut Rng) -> Result<RawEvent, Dropped> {
    let line =
        std::str::from_utf8(line).map_err(|_| Dropped::malformed("the line is not UTF-8"))?;
    let (name, rest) = line
        .split_once(':')
        .ok_or_else(|| Dropped::malformed("no ':' after the metric name"))?;
    if name.is_empty() {
        return Err(Dropped::malformed("empty metric name"));
    }
    let mut fields = rest.split('|');
    let values = fields.next().unwrap_or_default();
    let kind = fields
        .next()
        .ok_or_else(|| Dropped::malformed("no '|<type>' after the value"))?;
    match kind {
        "c" => {}
        "g" | "ms" | "h" | "s" | "d" => {
            let what = match kind {
                "g" => "gauge",
                "ms" => "timer",
                "h" => "histogram",
                "s" => "set",
                _ => "distribution",
            };
            return Err(Dropped {
                outcome: Outcome::UnsupportedType,
                reason: format!("{what} lines (|{kind}) are not counted: only counters (|c) are"),
            });
        }
        other => {
            return Err(Dropped::malformed(format!(
                "unknown metric type {:?}",
                clip(other)
            )));
        }
    }
    let mut rate = None;
    let mut tags = None;
    let mut ts = None;
    for field in fields {
        let dup = |what: &str| Dropped::malformed(format!("{what} given twice"));
        if let Some(r) = field.strip_prefix('@') {
            if rate.is_some() {
                return Err(dup("sample rate"));
            }
            let r: f64 = r
                .parse()
                .ok()
                .filter(|r: &f64| *r > 0.0 && *r <= 1.0)
                .ok_or_else(|| {
                    Dropped::malformed(format!(
                        "sample rate {:?} is not a number in (0, 1]",
                        clip(r)
                    ))
                })?;
            rate = Some(r);
        } else if let Some(t) = field.strip_prefix('#') {
            if tags.is_some() {
                return Err(dup("tags"));
            }
            tags = Some(t);
        } else if let Some(t) = field.strip_prefix('T') {
            if ts.is_some() {
                return Err(dup("timestamp"));
            }
            ts = Some(t.parse::<i64>().map_err(|_| {
                Dropped::malformed(format!("timestamp {:?} is not unix seconds", clip(t)))
            })?);
        } else if field.starts_with("c:") || field.starts_with("e:") {
            // DogStatsD's container id and external data: not counted, not an error.
        } else {
            return Err(Dropped::malformed(format!(
                "unknown field {:?}",
                clip(field)
            )));
        }
    }
    let n = count(values, rate.unwrap_or(1.0), rng)?;
    let rule = map.rule(name);
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    if let Some(tags) = tags.filter(|t| !t.is_empty()) {
        for (i, tag) in tags.split(',').enumerate() {
            if i == MAX_TAGS_PER_LINE {
                return Err(Dropped::invalid(format!(
                    "a line carries at most {MAX_TAGS_PER_LINE} tags"
                )));
            }
            // A tag without a value (DogStatsD's `#production`, which many clients add to
            // every line) names no dimension value: it is ignored, unless the rule lists it
            // as a dimension, whose every event must then say its value.
            match tag.split_once(':') {
                Some(kv) => pairs.push(kv),
                None if rule.lists_tag(tag) => {
                    return Err(Dropped::invalid(format!(
                        "tag {:?} has no value: a dimension is name:value",
                        clip(tag)
                    )));
                }
                None => {}
            }
        }
    }
    let rest = name.strip_prefix(rule.prefix.as_str()).unwrap_or(name);
    let key = rule
        .key
        .render(name, rest, &pairs)
        .map_err(Dropped::invalid)?;
    let dims: Vec<(String, String)> = pairs
        .iter()
        .filter(|(k, _)| rule.keeps_tag(k))
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    if dims.len() > MAX_DIMS_PER_EVENT {
        return Err(Dropped::invalid(format!(
            "an event carries at most {MAX_DIMS_PER_EVENT} dimensions, got {} tags",
            dims.len()
        )));
    }
    Ok(RawEvent {
        ns: rule.namespace.clone(),
        key,
        ts,
        n: Some(n),
        dims,
    })
}

/// The count of a line: the sum of its values over the sample rate, rounded stochastically
/// unless it is a whole number already.
fn count(values: &str, rate: f64, rng: &mut Rng) -> Result<i64, Dropped> {
    let bad = |v: &str| Dropped::malformed(format!("value {:?} is not a number", clip(v)));
    let out_of_range = || Dropped::invalid("the count is out of range: |n| must be below 2^53");
    let mut exact: Option<i64> = Some(0);
    let mut sum = 0.0f64;
    for v in values.split(':') {
        let digits = v.strip_prefix(['-', '+']).unwrap_or(v);
        let is_int = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
        if is_int {
            let i: i64 = v.parse().map_err(|_| out_of_range())?;
            exact = exact.and_then(|e| e.checked_add(i));
            sum += i as f64;
        } else {
            let f: f64 = v.parse().map_err(|_| bad(v))?;
            if !f.is_finite() {
                return Err(bad(v));
            }
            exact = None;
            sum += f;
        }
    }
    if let Some(e) = exact.filter(|_| rate == 1.0) {
        return Ok(e);
    }
    let x = sum / rate;
    if !x.is_finite() || x.abs() >= AMOUNT_LIMIT as f64 {
        return Err(out_of_range());
    }
    let floor = x.floor();
    let up = rng.next_f64() < x - floor;
    Ok(floor as i64 + i64::from(up))
}

/// At most 64 characters of untrusted text, for a reason.
fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// Validates each line alone with the HTTP API's rules ([`ingest::prepare_each`]: each
/// namespace's schema read once), so a bad line is dropped without its neighbours, and
/// returns one batch of the good ones. A store error (reading a schema) fails the whole
/// batch: then the lines noted already were dropped, the rest are the caller's to count.
pub fn prepare_lines(
    store: &dyn Store,
    lines: Vec<RawEvent>,
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
    dropped: &mut dyn FnMut(Dropped),
) -> Result<Batch, StoreError> {
    ingest::prepare_each(store, lines, now, limits, defaults, &mut |_, e| {
        dropped(Dropped::invalid(match e {
            IngestError::Event { source, .. } => source.to_string(),
            IngestError::UnknownNamespace { ns, .. } => {
                format!("namespace {ns} does not exist (auto_create is off)")
            }
            IngestError::TooManyNamespaces { ns, max, .. } => ingest::too_many_namespaces(&ns, max),
            e => e.to_string(),
        }))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use tally_core::model::{Namespace, Schema, SchemaDoc};
    use tally_core::reference::MemStore;
    use tally_core::store::ManualClock;

    use super::*;

    const NOW: i64 = 1_795_176_000;

    fn line(s: &str) -> Result<RawEvent, Dropped> {
        parse_line(s.as_bytes(), &Mapping::default(), &mut Rng::new(7))
    }

    fn ev(key: &str, n: i64, ts: Option<i64>, dims: &[(&str, &str)]) -> RawEvent {
        RawEvent {
            ns: "statsd".into(),
            key: key.into(),
            ts,
            n: Some(n),
            dims: dims
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    /// The counter examples of Datadog's "DogStatsD datagram format" page.
    #[test]
    fn dogstatsd_counter_examples() {
        assert_eq!(line("page.views:1|c"), Ok(ev("page.views", 1, None, &[])));
        assert_eq!(
            line("users.online:1|c|#country:china"),
            Ok(ev("users.online", 1, None, &[("country", "china")]))
        );
        assert_eq!(
            line("users.online:1|c|#country:china|T1656581400"),
            Ok(ev(
                "users.online",
                1,
                Some(1_656_581_400),
                &[("country", "china")]
            ))
        );
        // @0.5: 1 / 0.5 = 2 exactly, whatever the draw.
        assert_eq!(
            line("page.views:1|c|@0.5|#env:prod"),
            Ok(ev("page.views", 2, None, &[("env", "prod")]))
        );
        assert_eq!(
            line("page.views:1|c|@0.5|#env:prod,country:de|T1656581400|c:83c0a99c0a54"),
            Ok(ev(
                "page.views",
                2,
                Some(1_656_581_400),
                &[("env", "prod"), ("country", "de")]
            ))
        );
        // Several values in one line (DogStatsD 1.1) add up; negative counts decrement.
        assert_eq!(
            line("page.views:1:2:3|c"),
            Ok(ev("page.views", 6, None, &[]))
        );
        assert_eq!(
            line("queue.depth:-4|c"),
            Ok(ev("queue.depth", -4, None, &[]))
        );
    }

    #[test]
    fn several_lines_per_datagram() {
        let mut out = Vec::new();
        let mut dropped = Vec::new();
        parse_datagram(
            b"a:1|c\nb:2|c|#k:v\r\n\nc:3|g\nd:4|c\n",
            &Mapping::default(),
            &mut Rng::new(1),
            &mut out,
            &mut |d| dropped.push(d.outcome),
        );
        assert_eq!(
            out,
            vec![
                ev("a", 1, None, &[]),
                ev("b", 2, None, &[("k", "v")]),
                ev("d", 4, None, &[])
            ]
        );
        assert_eq!(dropped, vec![Outcome::UnsupportedType]);
    }

    #[test]
    fn other_types_are_unsupported() {
        for l in [
            "temp:21|g",
            "req.time:320|ms",
            "size:5|h",
            "users:alice|s",
            "lat:1.5|d|#env:prod",
        ] {
            let d = line(l).unwrap_err();
            assert_eq!(d.outcome, Outcome::UnsupportedType, "{l}");
            assert!(d.reason.contains("only counters"), "{l}: {}", d.reason);
        }
    }

    #[test]
    fn malformed_lines_each_with_a_reason() {
        for (l, reason) in [
            ("page.views", "no ':'"),
            (":1|c", "empty metric name"),
            ("page.views:1", "no '|<type>'"),
            ("page.views:1|x", "unknown metric type \"x\""),
            ("page.views:abc|c", "value \"abc\" is not a number"),
            ("page.views:|c", "value \"\" is not a number"),
            ("page.views:nan|c", "not a number"),
            ("page.views:inf|c", "not a number"),
            ("page.views:1|c|@0", "sample rate \"0\""),
            ("page.views:1|c|@1.5", "sample rate \"1.5\""),
            ("page.views:1|c|@x", "sample rate \"x\""),
            ("page.views:1|c|@0.5|@0.5", "sample rate given twice"),
            ("page.views:1|c|Tsoon", "timestamp \"soon\""),
            ("page.views:1|c|#a:b|#c:d", "tags given twice"),
            ("page.views:1|c|zz", "unknown field \"zz\""),
        ] {
            let d = line(l).unwrap_err();
            assert_eq!(d.outcome, Outcome::Malformed, "{l}");
            assert!(d.reason.contains(reason), "{l}: {}", d.reason);
        }
        let d = parse_line(b"a\xff:1|c", &Mapping::default(), &mut Rng::new(1)).unwrap_err();
        assert_eq!(d, Dropped::malformed("the line is not UTF-8"));
    }

    #[test]
    fn limits_tags_and_lines() {
        let tags: Vec<String> = (0..17).map(|i| format!("t{i}:v")).collect();
        let d = line(&format!("k:1|c|#{}", tags.join(","))).unwrap_err();
        assert_eq!(d.outcome, Outcome::Invalid);
        assert!(d.reason.contains("at most 16"), "{}", d.reason);
        let sixteen = line(&format!("k:1|c|#{}", tags[..16].join(","))).unwrap();
        assert_eq!(sixteen.dims.len(), 16);
        // A tag without a value is ignored where no rule lists it: the line still counts,
        // and the tag is no dimension (nor does it count toward the 16).
        assert_eq!(
            line("k:1|c|#env,country:de,production"),
            Ok(ev("k", 1, None, &[("country", "de")]))
        );
        let mut seventeen = tags[..16].join(",");
        seventeen.push_str(",canary");
        assert_eq!(line(&format!("k:1|c|#{seventeen}")).unwrap().dims.len(), 16);
        // 2^53 parses, and the API's rules refuse it (see below); past i64 it cannot parse.
        assert_eq!(line("k:9007199254740992|c").unwrap().n, Some(1 << 53));
        let d = line("k:4503599627370496|c|@0.25").unwrap_err();
        assert!(d.reason.contains("out of range"), "{}", d.reason);
        let d = line("k:99999999999999999999|c").unwrap_err();
        assert!(d.reason.contains("out of range"), "{}", d.reason);

        // A full datagram of the shortest counter lines: every one counted (a cap of 4096
        // lines once dropped the rest as malformed).
        let datagram = "k:1|c\n".repeat(crate::statsd::MAX_DATAGRAM_BYTES / 6);
        assert!(datagram.len() + 6 > crate::statsd::MAX_DATAGRAM_BYTES);
        let (mut out, mut dropped) = (Vec::new(), Vec::new());
        parse_datagram(
            datagram.as_bytes(),
            &Mapping::default(),
            &mut Rng::new(1),
            &mut out,
            &mut |d| dropped.push(d),
        );
        assert_eq!(out.len(), 10_922);
        assert!(dropped.is_empty(), "{dropped:?}");
    }

    #[test]
    fn rules_route_names_build_keys_and_choose_tags() {
        use super::super::map::Rule;
        let dims = |d: &[&str]| Some(d.iter().map(|s| (*s).to_owned()).collect());
        let map = Mapping::new(
            Rule::new("", "statsd", "{name}", None).unwrap(),
            vec![
                Rule::new("api.", "api", "{rest}.{tag:org}", dims(&["status"])).unwrap(),
                Rule::new("web.", "web", "{tag:site}", None).unwrap(),
            ],
        );
        let parse = |l: &str| parse_line(l.as_bytes(), &map, &mut Rng::new(1));
        let mut want = ev("hits.42", 1, None, &[("status", "200")]);
        want.ns = "api".into();
        // Unlisted tags are ignored, with or without a value.
        assert_eq!(
            parse("api.hits:1|c|#org:42,status:200,env:prod,production"),
            Ok(want)
        );
        // Without a list: every tag but the key's.
        let mut want = ev("example.com", 2, None, &[("country", "de")]);
        want.ns = "web".into();
        assert_eq!(
            parse("web.views:2|c|#site:example.com,country:de"),
            Ok(want)
        );
        assert_eq!(
            parse("other:1|c|#env:prod"),
            Ok(ev("other", 1, None, &[("env", "prod")]))
        );
        let d = parse("api.hits:1|c|#status:200").unwrap_err();
        assert_eq!(d.outcome, Outcome::Invalid);
        assert!(d.reason.contains("tag \"org\""), "{}", d.reason);
        // A listed tag without a value still spoils the line.
        let d = parse("api.hits:1|c|#org:1,status").unwrap_err();
        assert!(d.reason.contains("has no value"), "{}", d.reason);
        // Tags that are not dimensions do not count toward the 16.
        let tags: Vec<String> = (0..40).map(|i| format!("t{i}:v")).collect();
        let l = format!("api.hits:1|c|#org:1,{}", tags.join(","));
        assert_eq!(parse(&l).unwrap().dims.len(), 0);
        let tags: Vec<String> = (0..65).map(|i| format!("t{i}:v")).collect();
        let d = parse(&format!("api.hits:1|c|#{}", tags.join(","))).unwrap_err();
        assert!(d.reason.contains("at most 64 tags"), "{}", d.reason);
    }

    #[test]
    fn unicode_names_and_tags() {
        assert_eq!(
            line("página.vistas:1|c|#país:España"),
            Ok(ev("página.vistas", 1, None, &[("país", "España")]))
        );
        assert_eq!(line("访问:3|c"), Ok(ev("访问", 3, None, &[])));
    }

    #[test]
    fn sample_rates_are_unbiased_integers() {
        let mut rng = Rng::new(42);
        let mut total = 0i64;
        for _ in 0..100_000 {
            let e = parse_line(b"k:1|c|@0.3", &Mapping::default(), &mut rng).unwrap();
            let n = e.n.unwrap();
            assert!(n == 3 || n == 4, "{n}");
            total += n;
        }
        // Expected 333,333.3; the standard deviation of the sum is ~145.
        assert!((total - 333_333).abs() < 1_000, "{total}");
        let mut rng = Rng::new(42);
        let halves: i64 = (0..10_000)
            .map(|_| {
                parse_line(b"k:0.5|c", &Mapping::default(), &mut rng)
                    .unwrap()
                    .n
                    .unwrap()
            })
            .sum();
        assert!((halves - 5_000).abs() < 250, "{halves}");
    }

    fn prepare(store: &MemStore, lines: &[&str]) -> (Batch, Vec<Dropped>) {
        let raws = lines.iter().map(|l| line(l).unwrap()).collect::<Vec<_>>();
        let mut dropped = Vec::new();
        let b = prepare_lines(
            store,
            raws,
            NOW,
            &Limits::default(),
            &Defaults::default(),
            &mut |d| dropped.push(d),
        )
        .unwrap();
        (b, dropped)
    }

    #[test]
    fn lines_are_validated_alone_with_the_api_rules() {
        let store = MemStore::new(Arc::new(ManualClock::new(NOW)));
        let ns = Namespace::new("statsd").unwrap();
        let schema = Schema::from_doc(&SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: Some(vec!["country".into()]),
        })
        .unwrap();
        store.put_schema(&ns, &schema).unwrap();
        let long = format!("{}:1|c", "k".repeat(257));
        let (batch, dropped) = prepare(
            &store,
            &[
                "ok:1|c|#country:de",
                "bad:1|c|#env:prod",
                &long,
                "Bad-Dim:1|c|#Env:x",
                "future:1|c|T9999999999",
                "big:9007199254740992|c",
                "ok:2|c",
            ],
        );
        assert_eq!(batch.increments.len(), 2);
        assert!(batch.create.is_empty());
        let reasons: Vec<_> = dropped.iter().map(|d| d.reason.as_str()).collect();
        assert_eq!(reasons.len(), 5, "{reasons:?}");
        assert!(dropped.iter().all(|d| d.outcome == Outcome::Invalid));
        assert!(reasons[0].contains("not in the namespace's allow-list"));
        assert!(reasons[1].contains("invalid key"), "{}", reasons[1]);
        assert!(reasons[2].contains("invalid dimension"), "{}", reasons[2]);
        assert!(reasons[3].contains("timestamp"), "{}", reasons[3]);
        assert!(reasons[4].contains("invalid amount"), "{}", reasons[4]);
    }

    #[test]
    fn a_new_namespace_is_created_once_per_batch() {
        let store = MemStore::new(Arc::new(ManualClock::new(NOW)));
        let (batch, dropped) = prepare(&store, &["a:1|c", "b:1|c", "a:1|c"]);
        assert!(dropped.is_empty());
        assert_eq!(batch.create.len(), 1);
        assert_eq!(batch.increments.len(), 3);
        store.apply(&batch).unwrap();
    }

    /// Past `[limits] max_namespaces` a line whose namespace does not exist is dropped as
    /// `invalid`, saying why; lines of namespaces that exist are kept.
    #[test]
    fn no_namespace_is_created_past_the_limit() {
        let store = MemStore::new(Arc::new(ManualClock::new(NOW)));
        let other = Namespace::new("other").unwrap();
        store.put_schema(&other, &Schema::default()).unwrap();
        let mut raws = vec![line("a:1|c").unwrap()];
        let mut kept = line("b:1|c").unwrap();
        kept.ns = "other".into();
        raws.push(kept);
        let limits = Limits {
            max_namespaces: 1,
            ..Limits::default()
        };
        let mut dropped = Vec::new();
        let batch = prepare_lines(&store, raws, NOW, &limits, &Defaults::default(), &mut |d| {
            dropped.push(d)
        })
        .unwrap();
        assert_eq!(batch.increments.len(), 1);
        assert!(batch.create.is_empty());
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].outcome, Outcome::Invalid);
        assert!(
            dropped[0]
                .reason
                .starts_with("namespace statsd would be one too many"),
            "{}",
            dropped[0].reason
        );
    }

    /// Found by an independent review: a sign with no digits was taken for an integer too
    /// long to parse, and dropped as `invalid` ("out of range") rather than `malformed`.
    #[test]
    fn a_bare_sign_is_malformed() {
        for l in ["k:-|c", "k:+|c", "k:1:-|c"] {
            let d = line(l).unwrap_err();
            assert_eq!(d.outcome, Outcome::Malformed, "{l}: {}", d.reason);
            assert!(d.reason.contains("is not a number"), "{l}: {}", d.reason);
        }
    }
}
