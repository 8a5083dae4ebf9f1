//! What the client commands print without `--json`: each answer of SPEC §3 as human text —
//! two aligned columns for series, breakdowns, dashboards and top keys, one line for a window
//! or an increment, one key a line for `keys`. Rendering is pure (answer in, text out), so the
//! tests below pin the exact text and the caller alone deals with stdout.

use tally_core::query::{
    Accepted, BreakdownAnswer, DashboardAnswer, KeysAnswer, Point, SeriesAnswer, TopAnswer,
    WindowAnswer, WindowCount,
};
use tally_core::store::Maintenance;

/// An answer as the text a person reads, every line ending in `\n`.
pub trait Render {
    fn render(&self) -> String;
}

impl Render for SeriesAnswer {
    fn render(&self) -> String {
        points(&self.points, self.total)
    }
}

impl Render for BreakdownAnswer {
    fn render(&self) -> String {
        let mut rows = vec![(self.dim.clone(), "n".to_owned())];
        rows.extend(
            self.values
                .iter()
                .map(|v| (v.value.clone(), v.n.to_string())),
        );
        rows.push(("(other)".to_owned(), self.other.to_string()));
        rows.push(("(unset)".to_owned(), self.unset.to_string()));
        rows.push(("total".to_owned(), self.total.to_string()));
        columns(&rows)
    }
}

impl Render for WindowAnswer {
    fn render(&self) -> String {
        window(&self.window)
    }
}

/// The timeline, then each dimension's breakdown after a blank line.
impl Render for DashboardAnswer {
    fn render(&self) -> String {
        let mut text = points(&self.timeline, self.total);
        for b in self.breakdowns.values() {
            text.push('\n');
            text.push_str(&b.render());
        }
        text
    }
}

impl Render for TopAnswer {
    fn render(&self) -> String {
        let mut rows = vec![("key".to_owned(), "n".to_owned())];
        rows.extend(self.keys.iter().map(|k| (k.key.clone(), k.n.to_string())));
        rows.push(("(other)".to_owned(), self.other.to_string()));
        rows.push(("total".to_owned(), self.total.to_string()));
        columns(&rows)
    }
}

/// One key a line, then how to ask for the next page when there is one.
impl Render for KeysAnswer {
    fn render(&self) -> String {
        let mut text = String::new();
        for k in &self.keys {
            text.push_str(k);
            text.push('\n');
        }
        if let Some(next) = &self.next {
            text.push_str(&format!("(more: --after {next})\n"));
        }
        text
    }
}

impl Render for Maintenance {
    fn render(&self) -> String {
        format!(
            "flushed {} segment(s), {} data points; {} log file(s) removed\ncompacted: {} segment(s) merged into {}, {} past retention dropped\n",
            self.flushed_segments,
            self.flushed_points,
            self.log_files_removed,
            self.merged,
            self.written,
            self.dropped
        )
    }
}

impl Render for Accepted {
    fn render(&self) -> String {
        let mut text = format!("accepted {}\n", self.accepted);
        if let Some(w) = &self.window {
            text.push_str(&window(w));
        }
        text
    }
}

fn window(w: &WindowCount) -> String {
    format!(
        "last {}: {} (from {}, {} buckets)\n",
        w.last, w.n, w.from_t, w.resolution
    )
}

fn points(points: &[Point], total: i64) -> String {
    let mut rows = vec![("t".to_owned(), "n".to_owned())];
    rows.extend(points.iter().map(|p| (p.t.clone(), p.n.to_string())));
    rows.push(("total".to_owned(), total.to_string()));
    columns(&rows)
}

/// Two columns, the first padded to its widest cell (in characters) and two spaces between;
/// no trailing spaces.
fn columns(rows: &[(String, String)]) -> String {
    let width = rows
        .iter()
        .map(|(a, _)| a.chars().count())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (a, b) in rows {
        let line = format!("{a:<width$}  {b}");
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tally_core::query::{KeyCount, Span, ValueCount};

    use super::*;

    fn span() -> Span {
        Span {
            from: 1_779_926_400,
            from_t: "2026-05-28T00:00:00+00:00".into(),
            to: 1_780_012_800,
            to_t: "2026-05-29T00:00:00+00:00".into(),
        }
    }

    fn point(ts: i64, t: &str, n: i64) -> Point {
        Point { ts, t: t.into(), n }
    }

    fn breakdown(dim: &str, values: &[(&str, i64)], other: i64, unset: i64) -> BreakdownAnswer {
        let values: Vec<ValueCount> = values
            .iter()
            .map(|&(value, n)| ValueCount {
                value: value.into(),
                n,
            })
            .collect();
        BreakdownAnswer {
            ns: "clicks".into(),
            key: "lnk/1".into(),
            dim: dim.into(),
            resolution: "1h".into(),
            span: span(),
            total: values.iter().map(|v| v.n).sum::<i64>() + other + unset,
            values,
            other,
            unset,
        }
    }

    fn window_count() -> WindowCount {
        WindowCount {
            last: "1h".into(),
            resolution: "1m".into(),
            from: 1_795_365_420,
            from_t: "2026-11-22T16:37:00+00:00".into(),
            n: 42,
        }
    }

    #[test]
    fn series_is_a_column_of_points_and_the_total() {
        let a = SeriesAnswer {
            ns: "clicks".into(),
            key: "lnk/1".into(),
            unit: "day".into(),
            every: 1,
            tz: "America/New_York".into(),
            resolution: "1h".into(),
            dim: Some("country".into()),
            value: Some("US".into()),
            span: span(),
            total: 1211,
            points: vec![
                point(1_779_854_400, "2026-05-27T00:00:00-04:00", 0),
                point(1_779_940_800, "2026-05-28T00:00:00-04:00", 1212),
                point(1_780_027_200, "2026-05-29T00:00:00-04:00", -1),
            ],
        };
        assert_eq!(
            a.render(),
            "\
t                          n
2026-05-27T00:00:00-04:00  0
2026-05-28T00:00:00-04:00  1212
2026-05-29T00:00:00-04:00  -1
total                      1211
"
        );
    }

    #[test]
    fn an_empty_series_still_has_its_header_and_total() {
        let a = SeriesAnswer {
            ns: "clicks".into(),
            key: "k".into(),
            unit: "hour".into(),
            every: 1,
            tz: "UTC".into(),
            resolution: "1h".into(),
            dim: None,
            value: None,
            span: span(),
            total: 0,
            points: Vec::new(),
        };
        assert_eq!(a.render(), "t      n\ntotal  0\n");
    }

    #[test]
    fn breakdown_pads_by_characters_and_ends_with_other_unset_total() {
        let a = breakdown("country", &[("US", 3), ("ÜÖ", 12)], 2, -1);
        assert_eq!(
            a.render(),
            "\
country  n
US       3
ÜÖ       12
(other)  2
(unset)  -1
total    16
"
        );
        // A value wider than the header widens the column.
        let a = breakdown("os", &[("a-long-value|x", 1)], 0, 0);
        assert_eq!(
            a.render(),
            "\
os              n
a-long-value|x  1
(other)         0
(unset)         0
total           1
"
        );
    }

    #[test]
    fn window_is_one_line() {
        let a = WindowAnswer {
            ns: "clicks".into(),
            key: "lnk/1".into(),
            window: window_count(),
        };
        assert_eq!(
            a.render(),
            "last 1h: 42 (from 2026-11-22T16:37:00+00:00, 1m buckets)\n"
        );
    }

    #[test]
    fn dashboard_is_the_timeline_then_each_breakdown_in_dimension_order() {
        let a = DashboardAnswer {
            ns: "clicks".into(),
            key: "lnk/1".into(),
            unit: "day".into(),
            every: 1,
            tz: "Europe/Paris".into(),
            resolution: "1h".into(),
            dim: None,
            value: None,
            span: span(),
            total: 4,
            timeline: vec![
                point(1_779_919_200, "2026-05-28T00:00:00+02:00", 5),
                point(1_780_005_600, "2026-05-29T00:00:00+02:00", -1),
            ],
            breakdowns: BTreeMap::from([
                (
                    "device".to_owned(),
                    breakdown("device", &[("mobile", 3)], 0, 1),
                ),
                (
                    "country".to_owned(),
                    breakdown("country", &[("US", 3), ("FR", 2)], 0, -1),
                ),
            ]),
        };
        assert_eq!(
            a.render(),
            "\
t                          n
2026-05-28T00:00:00+02:00  5
2026-05-29T00:00:00+02:00  -1
total                      4

country  n
US       3
FR       2
(other)  0
(unset)  -1
total    4

device   n
mobile   3
(other)  0
(unset)  1
total    4
"
        );
    }

    #[test]
    fn a_dashboard_without_breakdowns_is_its_timeline() {
        let a = DashboardAnswer {
            ns: "clicks".into(),
            key: "k".into(),
            unit: "day".into(),
            every: 1,
            tz: "UTC".into(),
            resolution: "1h".into(),
            dim: None,
            value: None,
            span: span(),
            total: 0,
            timeline: vec![point(1_779_926_400, "2026-05-28T00:00:00+00:00", 0)],
            breakdowns: BTreeMap::new(),
        };
        assert_eq!(
            a.render(),
            "t                          n\n2026-05-28T00:00:00+00:00  0\ntotal                      0\n"
        );
    }

    #[test]
    fn top_lists_keys_then_other_and_total() {
        let a = TopAnswer {
            ns: "clicks".into(),
            dim: Some("country".into()),
            value: Some("FR".into()),
            resolution: "1h".into(),
            span: span(),
            total: 9,
            keys: vec![
                KeyCount {
                    key: "lnk 2".into(),
                    n: 5,
                },
                KeyCount {
                    key: "lnk/1".into(),
                    n: 4,
                },
            ],
            other: 0,
        };
        assert_eq!(
            a.render(),
            "\
key      n
lnk 2    5
lnk/1    4
(other)  0
total    9
"
        );
    }

    #[test]
    fn keys_are_one_a_line_with_the_next_page_when_there_is_one() {
        let mut a = KeysAnswer {
            ns: "clicks".into(),
            keys: vec!["lnk 2".into(), "lnk/1".into()],
            next: Some("lnk/1".into()),
        };
        assert_eq!(a.render(), "lnk 2\nlnk/1\n(more: --after lnk/1)\n");
        a.next = None;
        assert_eq!(a.render(), "lnk 2\nlnk/1\n");
        a.keys.clear();
        assert_eq!(a.render(), "");
    }

    #[test]
    fn an_increment_shows_the_window_when_asked_for() {
        let mut a = Accepted {
            accepted: 1,
            window: None,
        };
        assert_eq!(a.render(), "accepted 1\n");
        a.window = Some(window_count());
        assert_eq!(
            a.render(),
            "accepted 1\nlast 1h: 42 (from 2026-11-22T16:37:00+00:00, 1m buckets)\n"
        );
    }
}
