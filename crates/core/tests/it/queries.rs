//! Query semantics on the reference store: answers, tier choice and every refusal.

use std::sync::Arc;

use tally_core::ErrorCode;
use tally_core::ingest::{self, Defaults, Limits};
use tally_core::model::{Namespace, RawEvent, Schema, SchemaDoc, parse_timestamp};
use tally_core::query::{self, Ctx, QueryError};
use tally_core::reference::MemStore;
use tally_core::store::{Clock, ManualClock, Store};

pub struct Db {
    pub clock: Arc<ManualClock>,
    pub store: MemStore,
}

pub fn ts(s: &str) -> i64 {
    parse_timestamp(s).unwrap()
}

impl Db {
    pub fn new(now: &str) -> Db {
        let clock = Arc::new(ManualClock::new(ts(now)));
        let store = MemStore::new(clock.clone());
        Db { clock, store }
    }

    pub fn schema(
        &self,
        ns: &str,
        tiers: &[&str],
        breakdown: Option<&[&str]>,
        dims: Option<&[&str]>,
    ) {
        let doc = SchemaDoc {
            tiers: tiers.iter().map(|s| s.to_string()).collect(),
            breakdown_tiers: breakdown.map(|b| b.iter().map(|s| s.to_string()).collect()),
            dimensions: dims.map(|b| b.iter().map(|s| s.to_string()).collect()),
        };
        self.store
            .put_schema(
                &Namespace::new(ns).unwrap(),
                &Schema::from_doc(&doc).unwrap(),
            )
            .unwrap();
    }

    pub fn raw(ns: &str, key: &str, t: i64, n: i64, dims: &[(&str, &str)]) -> RawEvent {
        RawEvent {
            ns: ns.into(),
            key: key.into(),
            ts: Some(t),
            n: Some(n),
            dims: dims
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        }
    }

    pub fn ingest(&self, raws: &[RawEvent]) -> Result<(), ingest::IngestError> {
        let batch = ingest::prepare(
            &self.store,
            raws,
            self.clock.now(),
            &Limits::default(),
            &Defaults::default(),
        )?;
        self.store.apply(&batch)?;
        Ok(())
    }

    pub fn ctx(&self) -> Ctx {
        Ctx {
            now: self.clock.now(),
            max_points: 100_000,
            deadline: tally_core::store::Deadline::none(),
        }
    }

    pub fn series(
        &self,
        ns: &str,
        key: &str,
        p: &[(&str, &str)],
    ) -> Result<query::SeriesAnswer, QueryError> {
        let q = query::SeriesQuery::parse(ns, key, p)?;
        query::series(&self.store, self.ctx(), &q)
    }

    pub fn breakdown(
        &self,
        ns: &str,
        key: &str,
        p: &[(&str, &str)],
    ) -> Result<query::BreakdownAnswer, QueryError> {
        let q = query::BreakdownQuery::parse(ns, key, p)?;
        query::breakdown(&self.store, self.ctx(), &q)
    }

    pub fn top(&self, ns: &str, p: &[(&str, &str)]) -> Result<query::TopAnswer, QueryError> {
        let q = query::TopQuery::parse(ns, p)?;
        query::top(&self.store, self.ctx(), &q)
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, QueryError>) -> ErrorCode {
    r.unwrap_err().code()
}

#[test]
fn series_rolls_hours_into_new_york_days() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1h:forever"], None, None);
    db.ingest(&[
        Db::raw("clicks", "lnk_1", ts("2026-10-31T23:30:00-04:00"), 5, &[]),
        Db::raw("clicks", "lnk_1", ts("2026-11-01T01:30:00-04:00"), 2, &[]),
        Db::raw("clicks", "lnk_1", ts("2026-11-01T01:30:00-05:00"), 3, &[]),
        Db::raw("clicks", "lnk_1", ts("2026-11-01T23:59:59-05:00"), 1, &[]),
        Db::raw("clicks", "lnk_1", ts("2026-11-02T00:00:00-05:00"), 7, &[]),
    ])
    .unwrap();
    let a = db
        .series(
            "clicks",
            "lnk_1",
            &[
                ("from", "2026-10-31T12:00:00Z"),
                ("to", "2026-11-02T01:00:00-05:00"),
                ("unit", "day"),
                ("tz", "America/New_York"),
            ],
        )
        .unwrap();
    assert_eq!(a.span.from_t, "2026-10-31T00:00:00-04:00");
    assert_eq!(a.span.to_t, "2026-11-03T00:00:00-05:00");
    assert_eq!(a.resolution, "1h");
    let got: Vec<(&str, i64)> = a.points.iter().map(|p| (p.t.as_str(), p.n)).collect();
    assert_eq!(
        got,
        vec![
            ("2026-10-31T00:00:00-04:00", 5),
            ("2026-11-01T00:00:00-04:00", 6),
            ("2026-11-02T00:00:00-05:00", 7)
        ]
    );
    assert_eq!(a.total, 18);
    // The fall-back hour: two hourly buckets at 01:00 local, each with its own events.
    let h = db
        .series(
            "clicks",
            "lnk_1",
            &[
                ("from", "2026-11-01T00:00:00-04:00"),
                ("to", "2026-11-01T03:00:00-05:00"),
                ("unit", "hour"),
                ("tz", "America/New_York"),
            ],
        )
        .unwrap();
    let got: Vec<(&str, i64)> = h.points.iter().map(|p| (p.t.as_str(), p.n)).collect();
    assert_eq!(
        got,
        vec![
            ("2026-11-01T00:00:00-04:00", 0),
            ("2026-11-01T01:00:00-04:00", 2),
            ("2026-11-01T01:00:00-05:00", 3),
            ("2026-11-01T02:00:00-05:00", 0),
        ]
    );
}

#[test]
fn series_answer_has_the_spec_shape() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1h:forever"], None, None);
    let a = db
        .series(
            "clicks",
            "never_written",
            &[
                ("from", "1790827200"),
                ("to", "1790913600"),
                ("unit", "day"),
                ("tz", "America/New_York"),
            ],
        )
        .unwrap();
    let json = serde_json::to_value(&a).unwrap();
    let expected = serde_json::json!({
        "ns": "clicks", "key": "never_written", "unit": "day", "every": 1, "tz": "America/New_York",
        "resolution": "1h", "dim": null, "value": null,
        "from": 1790827200, "from_t": "2026-10-01T00:00:00-04:00",
        "to": 1790913600, "to_t": "2026-10-02T00:00:00-04:00", "total": 0,
        "points": [{"ts": 1790827200, "t": "2026-10-01T00:00:00-04:00", "n": 0}]
    });
    assert_eq!(json, expected);
}

#[test]
fn series_refusals() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1h:forever"], None, Some(&["country"]));
    let base = [
        ("from", "2026-11-01T00:00:00Z"),
        ("to", "2026-11-02T00:00:00Z"),
        ("unit", "hour"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut p: Vec<(&str, &str)> = base.to_vec();
        for (k, v) in extra {
            p.retain(|(pk, _)| pk != k);
            p.push((k, v));
        }
        p
    };
    assert_eq!(
        code(db.series("nope", "k", &base)),
        ErrorCode::UnknownNamespace
    );
    // An inverted range is refused in its turn: after the namespace, unit and zone (found
    // by a review when range ends started keeping their fractions).
    let inverted = [
        ("from", "2026-11-02T00:00:00Z"),
        ("to", "2026-11-01T00:00:00Z"),
        ("unit", "hour"),
    ];
    assert_eq!(
        code(db.series("nope", "k", &inverted)),
        ErrorCode::UnknownNamespace
    );
    let bad_unit = [inverted[0], inverted[1], ("unit", "fortnight")];
    assert_eq!(
        code(db.series("clicks", "k", &bad_unit)),
        ErrorCode::InvalidUnit
    );
    let bad_tz = [inverted[0], inverted[1], inverted[2], ("tz", "Mars/Base")];
    assert_eq!(
        code(db.series("clicks", "k", &bad_tz)),
        ErrorCode::InvalidTimezone
    );
    assert_eq!(
        code(db.series("clicks", "k", &inverted)),
        ErrorCode::InvalidRange
    );
    let no_dim = [
        ("from", "2026-11-02T00:00:00Z"),
        ("to", "2026-11-01T00:00:00Z"),
        ("dim", "Bad Dim"),
    ];
    assert_eq!(
        code(db.breakdown("clicks", "k", &no_dim)),
        ErrorCode::InvalidDimension
    );
    assert_eq!(code(db.series("Bad", "k", &base)), ErrorCode::InvalidName);
    assert_eq!(code(db.series("clicks", "", &base)), ErrorCode::InvalidKey);
    assert_eq!(
        code(db.series("clicks", "k", &base[..2])),
        ErrorCode::MissingParameter
    );
    assert_eq!(
        code(db.series("clicks", "k", &base[1..])),
        ErrorCode::MissingParameter
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("from", "noon")]))),
        ErrorCode::InvalidTimestamp
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("unit", "fortnight")]))),
        ErrorCode::InvalidUnit
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("every", "5")]))),
        ErrorCode::InvalidUnit
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("every", "x")]))),
        ErrorCode::InvalidUnit
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("tz", "Mars/Base")]))),
        ErrorCode::InvalidTimezone
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("from", "2026-11-03T00:00:00Z")]))),
        ErrorCode::InvalidRange
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("dim", "country")]))),
        ErrorCode::MissingParameter
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("dim", "device"), ("value", "x")]))),
        ErrorCode::UnknownDimension
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("dim", "Dev"), ("value", "x")]))),
        ErrorCode::InvalidDimension
    );
    assert_eq!(
        code(db.series("clicks", "k", &with(&[("unit", "minute")]))),
        ErrorCode::NoTierForRange
    );
    let e = db
        .series(
            "clicks",
            "k",
            &with(&[("unit", "day"), ("tz", "Asia/Kolkata")]),
        )
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoTierForRange);
    assert_eq!(
        e.to_string(),
        "namespace clicks keeps hourly data; Asia/Kolkata day boundaries fall 30 minutes past the hour — add a 30m or finer tier"
    );
    let long = with(&[("from", "2000-01-01T00:00:00Z"), ("unit", "hour")]);
    let q = query::SeriesQuery::parse("clicks", "k", long.as_slice()).unwrap();
    let small = Ctx {
        now: db.ctx().now,
        max_points: 1000,
        deadline: tally_core::store::Deadline::none(),
    };
    assert_eq!(
        query::series(&db.store, small, &q).unwrap_err().code(),
        ErrorCode::TooManyPoints
    );
    // from == to: no points, and the instant is echoed.
    let a = db
        .series(
            "clicks",
            "k",
            &with(&[("from", "1790827217"), ("to", "1790827217")]),
        )
        .unwrap();
    assert_eq!(
        (a.span.from, a.span.to, a.points.len(), a.total),
        (1790827217, 1790827217, 0, 0)
    );
}

#[test]
fn retention_moves_queries_between_tiers() {
    let db = Db::new("2026-11-20T12:00:00Z");
    db.schema("api", &["1m:48h", "1h:forever"], None, None);
    db.ingest(&[Db::raw("api", "k", ts("2026-11-20T11:15:00Z"), 4, &[])])
        .unwrap();
    let p = [
        ("from", "2026-11-20T11:00:00Z"),
        ("to", "2026-11-20T12:00:00Z"),
        ("unit", "minute"),
        ("every", "15"),
    ];
    let a = db.series("api", "k", &p).unwrap();
    assert_eq!(a.resolution, "1m");
    assert_eq!(
        a.points.iter().map(|p| p.n).collect::<Vec<_>>(),
        vec![0, 4, 0, 0]
    );
    // Three days later the minute tier no longer holds the range; hours still do.
    db.clock.advance(3 * 86_400);
    let e = db.series("api", "k", &p).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoTierForRange);
    assert!(
        e.to_string().starts_with("minute data is kept for 2d"),
        "{e}"
    );
    let h = db
        .series("api", "k", &[p[0], p[1], ("unit", "hour")])
        .unwrap();
    assert_eq!((h.resolution.as_str(), h.total), ("1h", 4));
}

#[test]
fn breakdown_top_values_other_unset() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1h:forever"], None, None);
    let t = ts("2026-11-19T10:00:00Z");
    db.ingest(&[
        Db::raw("clicks", "l", t, 5, &[("country", "US")]),
        Db::raw("clicks", "l", t, 3, &[("country", "DE")]),
        Db::raw("clicks", "l", t, 3, &[("country", "BR")]),
        Db::raw("clicks", "l", t, 1, &[("country", "FR")]),
        Db::raw("clicks", "l", t, 2, &[("country", "IT")]),
        Db::raw("clicks", "l", t, -2, &[("country", "IT")]),
        Db::raw("clicks", "l", t, 4, &[]),
    ])
    .unwrap();
    let p = [
        ("dim", "country"),
        ("from", "2026-11-19T00:00:00Z"),
        ("to", "2026-11-20T00:00:00Z"),
        ("limit", "2"),
    ];
    let a = db.breakdown("clicks", "l", &p).unwrap();
    let values: Vec<(&str, i64)> = a.values.iter().map(|v| (v.value.as_str(), v.n)).collect();
    // Ties by value bytes (BR before DE); IT nets to 0 and is left out.
    assert_eq!(values, vec![("US", 5), ("BR", 3)]);
    assert_eq!((a.other, a.unset, a.total), (4, 4, 16));
    // An exact range must lie on tier boundaries; with a unit the ends are floored/ceiled.
    let off = [
        ("dim", "country"),
        ("from", "2026-11-19T00:30:00Z"),
        ("to", "2026-11-20T00:00:00Z"),
    ];
    assert_eq!(
        code(db.breakdown("clicks", "l", &off)),
        ErrorCode::NoTierForRange
    );
    let floored = db
        .breakdown("clicks", "l", &[off[0], off[1], off[2], ("unit", "day")])
        .unwrap();
    assert_eq!(
        (floored.span.from, floored.total),
        (ts("2026-11-19T00:00:00Z"), 16)
    );
    assert_eq!(
        code(db.breakdown("clicks", "l", &[p[1], p[2]])),
        ErrorCode::MissingParameter
    );
    assert_eq!(
        code(db.breakdown("clicks", "l", &[p[0], p[1], p[2], ("limit", "0")])),
        ErrorCode::InvalidLimit
    );
    assert_eq!(
        code(db.breakdown("clicks", "l", &[p[0], p[1], p[2], ("limit", "10001")])),
        ErrorCode::InvalidLimit
    );
}

#[test]
fn compound_dimensions_count_pairs() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema(
        "clicks",
        &["1h:forever"],
        None,
        Some(&["country", "device", "country+device"]),
    );
    let t = ts("2026-11-19T10:00:00Z");
    db.ingest(&[
        Db::raw(
            "clicks",
            "l",
            t,
            2,
            &[("country", "US"), ("device", "mobile")],
        ),
        Db::raw(
            "clicks",
            "l",
            t,
            1,
            &[("country", "US"), ("device", "desk|top")],
        ),
        Db::raw("clicks", "l", t, 1, &[("country", "US")]),
    ])
    .unwrap();
    let range = [
        ("from", "2026-11-19T00:00:00Z"),
        ("to", "2026-11-20T00:00:00Z"),
    ];
    // `+` in a query string decodes to a space; both spellings name the compound.
    let a = db
        .breakdown(
            "clicks",
            "l",
            &[range[0], range[1], ("dim", "country device")],
        )
        .unwrap();
    let values: Vec<(&str, i64)> = a.values.iter().map(|v| (v.value.as_str(), v.n)).collect();
    assert_eq!(values, vec![("US|mobile", 2), ("US|desk\\|top", 1)]);
    assert_eq!((a.dim.as_str(), a.unset, a.total), ("country+device", 1, 4));
    let s = db
        .series(
            "clicks",
            "l",
            &[
                range[0],
                range[1],
                ("unit", "day"),
                ("dim", "country+device"),
                ("value", "US|mobile"),
            ],
        )
        .unwrap();
    assert_eq!(s.total, 2);
    // An event dimension outside the allow-list refuses the whole batch.
    let e = db
        .ingest(&[
            Db::raw("clicks", "l", t, 1, &[]),
            Db::raw("clicks", "l", t, 1, &[("os", "ios")]),
        ])
        .unwrap_err();
    assert_eq!(
        (e.code(), e.index()),
        (ErrorCode::UnknownDimension, Some(1))
    );
    assert_eq!(
        db.breakdown("clicks", "l", &[range[0], range[1], ("dim", "country")])
            .unwrap()
            .total,
        4
    );
}

#[test]
fn window_sums_the_most_recent_buckets_of_the_finest_fitting_tier() {
    let db = Db::new("2026-11-20T12:00:30Z");
    db.schema(
        "api",
        &["1s:2h", "1m:48h", "1h:forever"],
        Some(&["1h"]),
        None,
    );
    let now = db.ctx().now;
    db.ingest(&[
        Db::raw("api", "key", now, 1, &[]),
        Db::raw("api", "key", now - 59, 2, &[]),
        Db::raw("api", "key", now - 60, 4, &[]),
        Db::raw("api", "key", now - 3 * 3600, 8, &[]),
    ])
    .unwrap();
    let w = |last: &str| {
        let q = query::WindowQuery::parse("api", "key", &[("last", last)][..]).unwrap();
        query::window(&db.store, db.ctx(), &q)
    };
    let a = w("60s").unwrap();
    assert_eq!(
        (a.window.resolution.as_str(), a.window.n, a.window.from),
        ("1s", 3, now - 59)
    );
    let a = w("3h").unwrap();
    // 1m tier: the 180 most recent minutes, the current one included.
    // The 09:00:30 event sits in the 09:00 minute, just outside those 180.
    assert_eq!((a.window.resolution.as_str(), a.window.n), ("1m", 7));
    assert_eq!(a.window.from_t, "2026-11-20T09:01:00+00:00");
    let a = w("7d").unwrap();
    assert_eq!((a.window.resolution.as_str(), a.window.n), ("1h", 15));
    db.schema("short", &["1m:1h"], None, None);
    let q = query::WindowQuery::parse("short", "key", &[("last", "2h")][..]).unwrap();
    assert_eq!(
        query::window(&db.store, db.ctx(), &q).unwrap_err().code(),
        ErrorCode::NoTierForRange
    );
    assert_eq!(
        query::WindowQuery::parse("api", "key", &[("last", "0s")][..])
            .unwrap_err()
            .code(),
        ErrorCode::InvalidDuration
    );
    assert_eq!(
        query::WindowQuery::parse("api", "key", &[][..])
            .unwrap_err()
            .code(),
        ErrorCode::MissingParameter
    );
}

#[test]
fn dashboard_has_timeline_and_every_nonzero_dimension() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1m:48h", "1h:forever"], None, None);
    let t = ts("2026-11-19T10:20:00Z");
    db.ingest(&[
        Db::raw(
            "clicks",
            "l",
            t,
            2,
            &[("country", "US"), ("referrer", "x.com")],
        ),
        Db::raw("clicks", "l", t + 3600, 1, &[("country", "DE")]),
        Db::raw("clicks", "l", t, 1, &[("status", "a")]),
        Db::raw("clicks", "l", t, -1, &[("status", "a")]),
    ])
    .unwrap();
    let p = [
        ("from", "2026-11-19T00:00:00Z"),
        ("to", "2026-11-20T00:00:00Z"),
        ("unit", "hour"),
        ("every", "6"),
    ];
    let q = query::DashboardQuery::parse("clicks", "l", &p[..]).unwrap();
    let a = query::dashboard(&db.store, db.ctx(), &q).unwrap();
    // Breakdowns read the breakdown tier (1h) even though 1m would also fit.
    assert_eq!((a.resolution.as_str(), a.total), ("1h", 3));
    assert_eq!(
        a.timeline.iter().map(|p| p.n).collect::<Vec<_>>(),
        vec![0, 3, 0, 0]
    );
    assert_eq!(
        a.breakdowns.keys().collect::<Vec<_>>(),
        vec!["country", "referrer"]
    );
    let c = &a.breakdowns["country"];
    assert_eq!((c.values.len(), c.unset, c.total), (2, 0, 3));
    assert_eq!(a.breakdowns["referrer"].unset, 1);
    let json = serde_json::to_value(&a).unwrap();
    assert!(json.get("timeline").is_some() && json.get("points").is_none());
}

#[test]
fn top_ranks_keys_exactly() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1h:forever"], None, None);
    let t = ts("2026-11-19T10:00:00Z");
    db.ingest(&[
        Db::raw("clicks", "b", t, 5, &[("country", "US")]),
        Db::raw("clicks", "a", t, 5, &[("country", "DE")]),
        Db::raw("clicks", "c", t, 9, &[("country", "US")]),
        Db::raw("clicks", "d", t, 1, &[]),
        Db::raw("clicks", "z", t, 0, &[]),
        Db::raw("clicks", "e", t - 86_400, 100, &[]),
    ])
    .unwrap();
    let range = [
        ("from", "2026-11-19T00:00:00Z"),
        ("to", "2026-11-20T00:00:00Z"),
    ];
    let a = db
        .top("clicks", &[range[0], range[1], ("limit", "3")])
        .unwrap();
    let keys: Vec<(&str, i64)> = a.keys.iter().map(|k| (k.key.as_str(), k.n)).collect();
    assert_eq!(keys, vec![("c", 9), ("a", 5), ("b", 5)]);
    assert_eq!((a.total, a.other), (20, 1));
    let us = db
        .top(
            "clicks",
            &[range[0], range[1], ("dim", "country"), ("value", "US")],
        )
        .unwrap();
    let keys: Vec<(&str, i64)> = us.keys.iter().map(|k| (k.key.as_str(), k.n)).collect();
    assert_eq!(keys, vec![("c", 9), ("b", 5)]);
    assert_eq!(
        (us.total, us.other, us.value.as_deref()),
        (14, 0, Some("US"))
    );
    assert_eq!(code(db.top("nope", &range)), ErrorCode::UnknownNamespace);
}

#[test]
fn keys_paginate_in_byte_order() {
    let db = Db::new("2026-11-20T00:00:00Z");
    let t = ts("2026-11-19T10:00:00Z");
    let names = ["b", "a", "ab", "é", "B", "a/b"];
    db.ingest(
        &names
            .iter()
            .map(|k| Db::raw("links", k, t, 1, &[]))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let page = |p: &[(&str, &str)]| {
        let q = query::KeysQuery::parse("links", p).unwrap();
        query::keys(&db.store, &q).unwrap()
    };
    let a = page(&[("limit", "2")]);
    assert_eq!(
        (a.keys.clone(), a.next.clone()),
        (vec!["B".to_owned(), "a".into()], Some("a".into()))
    );
    let b = page(&[("limit", "3"), ("after", "a")]);
    assert_eq!(b.keys, vec!["a/b", "ab", "b"]);
    let c = page(&[("limit", "3"), ("after", "b")]);
    assert_eq!((c.keys.clone(), c.next), (vec!["é".to_owned()], None));
    assert_eq!(page(&[("prefix", "a")]).keys, vec!["a", "a/b", "ab"]);
    assert_eq!(
        query::KeysQuery::parse("links", &[("limit", "x")][..])
            .unwrap_err()
            .code(),
        ErrorCode::InvalidLimit
    );
}

#[test]
fn auto_create_follows_defaults_and_a_refused_batch_creates_nothing() {
    let db = Db::new("2026-11-20T00:00:00Z");
    let t = ts("2026-11-19T10:00:00Z");
    let e = db
        .ingest(&[
            Db::raw("fresh", "k", t, 1, &[]),
            Db::raw("fresh", "", t, 1, &[]),
        ])
        .unwrap_err();
    assert_eq!((e.code(), e.index()), (ErrorCode::InvalidKey, Some(1)));
    assert!(db.store.namespaces().unwrap().is_empty());
    db.ingest(&[Db::raw("fresh", "k", t, 1, &[])]).unwrap();
    let ns = db.store.namespaces().unwrap();
    assert_eq!(ns.len(), 1);
    assert_eq!(ns[0].1.to_doc().tiers, vec!["1m:2d", "1h:forever"]);
    let off = Defaults {
        auto_create: false,
        ..Defaults::default()
    };
    let raws = [Db::raw("other", "k", t, 1, &[])];
    let e = ingest::prepare(&db.store, &raws, db.ctx().now, &Limits::default(), &off).unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownNamespace);
    let small = Limits {
        max_batch_events: 1,
        ..Limits::default()
    };
    let two = [
        Db::raw("fresh", "k", t, 1, &[]),
        Db::raw("fresh", "k", t, 1, &[]),
    ];
    let e =
        ingest::prepare(&db.store, &two, db.ctx().now, &small, &Defaults::default()).unwrap_err();
    assert_eq!(e.code(), ErrorCode::BatchTooLarge);
}

/// Counters wrap past 64 bits in every store, and so do the sums of queries over them
/// (a debug build panicked adding two hours of ~2^62 into a day): a day of two such hours
/// answers their wrapping sum, in a series and in a breakdown (subtotals and unset still
/// add up to the total, modulo 2^64).
#[test]
fn sums_of_counters_past_64_bits_wrap() {
    const MAX: i64 = (1 << 53) - 1;
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("big", &["1h:forever"], Some(&["1h"]), None);
    for hour in ["2026-11-19T01:00:00Z", "2026-11-19T02:00:00Z"] {
        let events: Vec<RawEvent> = (0..600)
            .map(|_| Db::raw("big", "k", ts(hour), MAX, &[("country", "US")]))
            .collect();
        db.ingest(&events).unwrap();
    }
    let want = MAX.wrapping_mul(1200);
    assert!(want < 0, "the day's sum wraps: {want}");
    let day = [
        ("from", "2026-11-19T00:00:00Z"),
        ("to", "2026-11-20T00:00:00Z"),
        ("unit", "day"),
    ];
    let s = db.series("big", "k", &day).unwrap();
    assert_eq!((s.total, s.points[0].n), (want, want));
    let b = db
        .breakdown("big", "k", &[day[0], day[1], ("dim", "country")])
        .unwrap();
    assert_eq!((b.total, b.values[0].n, b.unset), (want, want, 0));
}

/// A range's ends with a fraction of a second mean what the instants mean for events
/// counted by the whole second: the second 01:00:00 is before 01:00:00.5, so a `to` there
/// takes it (a review found ends floored: `to=…01:00:00.5Z` left that second out, and
/// `from` after `to` within one second answered nothing instead of `invalid_range`).
#[test]
fn fractions_of_a_second_in_a_range_count() {
    let db = Db::new("2026-11-20T00:00:00Z");
    db.schema("clicks", &["1s:forever", "1h:forever"], None, None);
    let at = ts("2026-11-19T01:00:00Z");
    db.ingest(&[Db::raw("clicks", "k", at, 3, &[])]).unwrap();
    let series = |from: &'static str, to: &'static str, unit: &'static str| {
        db.series("clicks", "k", &[("from", from), ("to", to), ("unit", unit)])
    };
    let a = series("2026-11-19T00:00:00Z", "2026-11-19T01:00:00.5Z", "hour").unwrap();
    assert_eq!((a.total, a.points.len()), (3, 2), "{a:?}");
    assert_eq!(a.span.to, ts("2026-11-19T02:00:00Z"));
    let a = series("2026-11-19T00:00:00Z", "2026-11-19T01:00:00Z", "hour").unwrap();
    assert_eq!((a.total, a.points.len()), (0, 1), "{a:?}");
    // Within one second: a point, none, or invalid_range, as the instants say.
    let a = series("2026-11-19T01:00:00.2Z", "2026-11-19T01:00:00.7Z", "second").unwrap();
    assert_eq!((a.total, a.points.len()), (3, 1), "{a:?}");
    let a = series("2026-11-19T01:00:00.5Z", "2026-11-19T01:00:00.5Z", "second").unwrap();
    assert_eq!((a.total, a.points.len()), (0, 0), "{a:?}");
    assert_eq!(
        code(series(
            "2026-11-19T01:00:00.7Z",
            "2026-11-19T01:00:00.2Z",
            "hour"
        )),
        ErrorCode::InvalidRange
    );
    // Without a unit the range is exact: 00:59:59.5 to 01:00:00.5 holds the second
    // 01:00:00 alone; 01:00:00.5 to 01:00:01 holds none.
    let top =
        |from: &'static str, to: &'static str| db.top("clicks", &[("from", from), ("to", to)]);
    let a = top("2026-11-19T00:59:59.5Z", "2026-11-19T01:00:00.5Z").unwrap();
    assert_eq!((a.total, a.span.from, a.span.to), (3, at, at + 1), "{a:?}");
    let a = top("2026-11-19T01:00:00.5Z", "2026-11-19T01:00:01Z").unwrap();
    assert_eq!(a.total, 0, "{a:?}");
    // An hourly tier alone cannot hold a range whose ends are not on its hours.
    db.schema("hourly", &["1h:forever"], None, None);
    db.ingest(&[Db::raw("hourly", "k", at, 3, &[])]).unwrap();
    let e = db.top(
        "hourly",
        &[
            ("from", "2026-11-19T00:00:00.5Z"),
            ("to", "2026-11-19T02:00:00Z"),
        ],
    );
    assert_eq!(code(e), ErrorCode::NoTierForRange);
}

/// After a schema change, each query kind reads only what holds its range whole: a window
/// passes over a tier added lately, a dashboard leaves out a dimension the allow-list began
/// counting after the range's start, and an export of a tier from before it is whole is
/// refused — each where it once answered too small with nothing to say so.
#[test]
fn queries_after_a_schema_change_read_only_what_holds_their_range_whole() {
    let db = Db::new("2026-11-20T12:00:30Z");
    let now = db.ctx().now;
    db.schema("api", &["1h:forever"], None, Some(&["country", "device"]));
    let both = [("country", "us"), ("device", "ios")];
    db.ingest(&[
        Db::raw("api", "key", now - 30, 1, &both),
        Db::raw("api", "key", now - 7200, 2, &both),
    ])
    .unwrap();
    // A per-second tier for rate limits, and a compound dimension.
    db.schema(
        "api",
        &["1s:2h", "1h:forever"],
        None,
        Some(&["country", "device", "country+device"]),
    );
    db.ingest(&[Db::raw("api", "key", now, 4, &both)]).unwrap();
    let q = query::WindowQuery::parse("api", "key", &[("last", "60s")][..]).unwrap();
    let a = query::window(&db.store, db.ctx(), &q).unwrap();
    assert_eq!(
        (a.window.resolution.as_str(), a.window.n),
        ("1h", 5),
        "the hourly tier holds the window whole; the new 1s tier would say 4"
    );
    let p = [
        ("from", "2026-11-20T09:00:00Z"),
        ("to", "2026-11-20T13:00:00Z"),
        ("unit", "hour"),
    ];
    let q = query::DashboardQuery::parse("api", "key", &p[..]).unwrap();
    let a = query::dashboard(&db.store, db.ctx(), &q).unwrap();
    assert_eq!(a.total, 7);
    assert_eq!(
        a.breakdowns.keys().collect::<Vec<_>>(),
        vec!["country", "device"],
        "country+device holds only the last event"
    );
    let e = db
        .breakdown(
            "api",
            "key",
            &[
                ("dim", "country+device"),
                ("from", "2026-11-20T09:00:00Z"),
                ("to", "2026-11-20T13:00:00Z"),
            ],
        )
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoTierForRange, "{e}");
    let q = query::ExportQuery::parse(
        "api",
        &[
            ("from", "2026-11-20T09:00:00Z"),
            ("to", "2026-11-20T13:00:00Z"),
            ("resolution", "1h"),
        ][..],
    )
    .unwrap();
    // An export of the hourly tier: every total and subtotal, but none of the compound's
    // rows from before the change made it whole.
    let plan = query::export_plan(&db.store, &q, 100_000, now).unwrap();
    let mut rows = Vec::new();
    query::export(
        &db.store,
        &plan,
        &tally_core::store::Deadline::none,
        &mut |r| {
            rows.push((r.ts, r.dim.to_owned(), r.n));
            true
        },
    )
    .unwrap();
    let hour = ts("2026-11-20T12:00:00Z");
    assert_eq!(
        rows,
        [
            (hour - 7200, String::new(), 2),
            (hour, String::new(), 5),
            (hour - 7200, "country".into(), 2),
            (hour, "country".into(), 5),
            (hour - 7200, "device".into(), 2),
            (hour, "device".into(), 5),
        ]
    );
    // An export of the per-second tier from before it was added is refused.
    let q = query::ExportQuery::parse(
        "api",
        &[
            ("from", "2026-11-20T11:59:00Z"),
            ("to", "2026-11-20T12:00:10Z"),
            ("resolution", "1s"),
        ][..],
    )
    .unwrap();
    let e = query::export_plan(&db.store, &q, 100_000, now).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NoTierForRange, "{e}");
    // Once the change (plus max_future_secs) is past, all of it serves.
    db.clock.advance(3 * 3600);
    let later = [
        ("from", "2026-11-20T14:00:00Z"),
        ("to", "2026-11-20T15:00:00Z"),
        ("resolution", "1h"),
    ];
    let q = query::ExportQuery::parse("api", &later[..]).unwrap();
    assert!(query::export_plan(&db.store, &q, 100_000, db.ctx().now).is_ok());
    let q = query::ExportQuery::parse(
        "api",
        &[
            ("from", "2026-11-20T14:00:00Z"),
            ("to", "2026-11-20T14:01:00Z"),
            ("resolution", "1s"),
        ][..],
    )
    .unwrap();
    assert!(query::export_plan(&db.store, &q, 100_000, db.ctx().now).is_ok());
}

/// An event dated exactly `max_future_secs` ahead is accepted, so one counted in the second
/// of a schema change may be dated that far: a tier the change adds is whole only from the
/// second after (found by review: the hourly tier answered 0 where the minute tier said 1).
#[test]
fn an_event_dated_as_far_ahead_as_allowed_is_not_lost_by_a_tier_added_in_its_second() {
    let db = Db::new("2026-11-20T12:00:00Z");
    let now = db.ctx().now;
    db.schema("c", &["1m:2d"], None, None);
    db.ingest(&[Db::raw("c", "k", now + 3600, 1, &[])]).unwrap();
    db.schema("c", &["1m:2d", "1h:forever"], None, None);
    db.clock.advance(2 * 3600);
    let range = |unit| {
        [
            ("from", "2026-11-20T13:00:00Z"),
            ("to", "2026-11-20T14:00:00Z"),
            ("unit", unit),
        ]
    };
    let a = db.series("c", "k", &range("hour")).unwrap();
    assert_eq!((a.resolution.as_str(), a.total), ("1m", 1));
    let a = db.series("c", "k", &range("minute")).unwrap();
    assert_eq!((a.resolution.as_str(), a.total), ("1m", 1));
}

/// A dashboard shows only the dimensions the schema counts now: one the allow-list stopped
/// counting (here `device`, still accepted as a part of `device+status`) kept its old
/// subtotals, and its breakdown was too small (found by a black-box review).
#[test]
fn a_dashboard_leaves_out_dimensions_the_schema_no_longer_counts() {
    let db = Db::new("2026-11-20T12:00:00Z");
    let now = db.ctx().now;
    db.schema("r", &["1h:forever"], None, None);
    let dims = [("device", "mobile"), ("status", "200")];
    db.ingest(&[Db::raw("r", "k", now - 7200, 1, &dims)])
        .unwrap();
    db.schema("r", &["1h:forever"], None, Some(&["device+status"]));
    db.ingest(&[Db::raw("r", "k", now - 7200, 1, &dims)])
        .unwrap();
    let p = [
        ("from", "2026-11-20T09:00:00Z"),
        ("to", "2026-11-20T12:00:00Z"),
        ("unit", "hour"),
    ];
    let q = query::DashboardQuery::parse("r", "k", &p[..]).unwrap();
    let a = query::dashboard(&db.store, db.ctx(), &q).unwrap();
    assert_eq!(a.total, 2);
    assert!(a.breakdowns.is_empty(), "{:?}", a.breakdowns.keys());
}
