//! The web dashboard of `tally serve` in a real browser: headless Chromium loads the pages
//! (`--dump-dom` after the page's own requests are done), and every number it rendered is
//! checked against the API's answer to the same question, fetched here over HTTP — in UTC
//! and in New York over the day its clocks fall back (25 hourly buckets, two at 01:00).
//!
//! Without Chromium the test says so and passes, unless `TALLY_REQUIRE_CHROMIUM` is set
//! (`scripts/test.sh` sets it, and installs Chromium), so CI cannot skip it silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Serving, serve_cmd, sigterm_and_wait, tally};

/// The events: a key with dimensions (a compound one included) on both sides of New
/// York's 2025-11-02 fall-back hour, and two more keys for the overview's top list.
const EVENTS: &str = r#"[
 {"ns": "clicks", "key": "lnk_1", "ts": "2025-11-02T05:30:00Z", "n": 1200, "dims": {"country": "US", "device": "mobile"}},
 {"ns": "clicks", "key": "lnk_1", "ts": "2025-11-02T06:30:00Z", "n": 34, "dims": {"country": "DE", "device": "desktop"}},
 {"ns": "clicks", "key": "lnk_1", "ts": "2025-11-02T15:00:00Z", "n": 1000, "dims": {"country": "US"}},
 {"ns": "clicks", "key": "lnk_2", "ts": "2025-11-02T12:00:00Z", "n": 7},
 {"ns": "clicks", "key": "lnk_big", "ts": "2025-11-02T13:00:00Z", "n": 5000}
]"#;

const CONFIG: &str = r#"
[namespaces.clicks]
tiers = ["1m:2d", "1h:forever"]
breakdown_tiers = ["1h"]
dimensions = ["country", "device", "country+device"]
"#;

/// The Chromium to drive: `$TALLY_CHROMIUM`, else `chromium` or `chromium-browser` on PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TALLY_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|d| [d.join("chromium"), d.join("chromium-browser")])
        .find(|p| p.is_file())
}

/// The page at `url` once it has rendered: Chromium's serialised DOM.
fn dump_dom(chrome: &Path, profile: &Path, url: &str) -> String {
    let mut child = Command::new(chrome)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--lang=en-US",
            // Virtual time waits for the page's fetches; this much more is a bound.
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", url])
        .env("TZ", "UTC")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromium");
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("chromium did not finish {url} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let dom = reader.join().unwrap();
    assert!(
        dom.contains(r#"<body data-state="ready">"#),
        "the page did not finish rendering {url}:\n{}",
        &dom[..dom.len().min(4000)]
    );
    dom
}

/// An element of the dumped DOM: its attributes and its text up to its first child tag.
#[derive(Debug)]
struct Element {
    attrs: BTreeMap<String, String>,
    text: String,
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&nbsp;", "\u{a0}")
        .replace("&amp;", "&")
}

/// Every element with `data-testid="{id}"`, in document order.
fn by_testid(dom: &str, id: &str) -> Vec<Element> {
    let needle = format!(r#"data-testid="{id}""#);
    let mut out = Vec::new();
    for (at, _) in dom.match_indices(&needle) {
        let start = dom[..at].rfind('<').unwrap();
        let end = at + dom[at..].find('>').unwrap();
        let tag = &dom[start..end];
        let mut attrs = BTreeMap::new();
        let mut rest = tag;
        while let Some(eq) = rest.find("=\"") {
            let name = rest[..eq].rsplit(' ').next().unwrap().to_owned();
            let after = &rest[eq + 2..];
            let close = after.find('"').unwrap();
            attrs.insert(name, unescape(&after[..close]));
            rest = &after[close + 1..];
        }
        let body = &dom[end + 1..];
        let text = unescape(&body[..body.find('<').unwrap_or(body.len())]);
        out.push(Element { attrs, text });
    }
    out
}

/// The one element with this test id and these attributes.
#[track_caller]
fn one<'a>(els: &'a [Element], attrs: &[(&str, &str)]) -> &'a Element {
    let found: Vec<&Element> = els
        .iter()
        .filter(|e| {
            attrs
                .iter()
                .all(|(k, v)| e.attrs.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert_eq!(found.len(), 1, "one element with {attrs:?} among {els:?}");
    found[0]
}

/// `n` as the page shows it in en-US: thousands separated by commas.
fn thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn n(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// The API's answer (and status) to `GET {base}{path}`.
fn get(base: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let agent = super::http_agent();
    let mut req = agent.get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let mut resp = req.call().unwrap();
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap())
}

fn serve_config(dir: &Path, config: &str) -> Serving {
    let file = dir.join("tally.toml");
    std::fs::write(&file, config).unwrap();
    serve_cmd(
        tally().env("TALLY_DATA", dir.join("data")),
        &["--config", file.to_str().unwrap()],
    )
}

/// A day in UTC, and the same calendar day in New York, where it has 25 hours.
const UTC_DAY: &str =
    "range=custom&from=2025-11-02T00:00:00Z&to=2025-11-03T00:00:00Z&unit=hour&tz=UTC";
const NY_DAY: &str = "range=custom&from=2025-11-02T00:00:00-04:00&to=2025-11-03T00:00:00-05:00&unit=hour&tz=America/New_York";

/// The same view's API parameters (the hash's, percent-encoded for a query string).
fn api_params(view: &str) -> String {
    view.trim_start_matches("range=custom&")
        .replace(':', "%3A")
        .replace('/', "%2F")
}

#[test]
fn dashboard_pages_show_the_apis_numbers_in_a_browser() {
    let Some(chrome) = chromium() else {
        assert!(
            std::env::var_os("TALLY_REQUIRE_CHROMIUM").is_none(),
            "TALLY_REQUIRE_CHROMIUM is set but no chromium is on PATH \
             (apt-get install -y chromium, or set TALLY_CHROMIUM)"
        );
        eprintln!(
            "SKIPPED dashboard_pages_show_the_apis_numbers_in_a_browser: no chromium on PATH \
             (apt-get install -y chromium; TALLY_REQUIRE_CHROMIUM=1 makes this a failure)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("chromium-profile");
    let s = serve_config(dir.path(), CONFIG);
    let base = s.url.trim_end_matches('/').to_owned();
    let agent = super::http_agent();
    let resp = agent
        .post(format!("{base}/v1/events"))
        .header("Content-Type", "application/json")
        .send(EVENTS)
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);

    // The overview: the top keys and the namespace total over the UTC day.
    let (status, top) = get(
        &base,
        &format!("/v1/ns/clicks/top?limit=10&{}", api_params(UTC_DAY)),
        None,
    );
    assert_eq!(status, 200, "{top}");
    let dom = dump_dom(&chrome, &profile, &format!("{base}/#/?{UTC_DAY}"));
    let shown = by_testid(&dom, "top-n");
    let keys = top["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 3, "{top}");
    assert_eq!(shown.len(), keys.len(), "{shown:?}");
    for k in keys {
        let key = k["key"].as_str().unwrap();
        let el = one(&shown, &[("data-ns", "clicks"), ("data-key", key)]);
        assert_eq!(el.text, thousands(n(&k["n"])), "top key {key}");
    }
    assert_eq!(
        shown[0].attrs["data-key"], "lnk_big",
        "ordered as the API ranks"
    );
    assert_eq!(shown[0].text, "5,000");
    let total = by_testid(&dom, "ns-total");
    assert_eq!(
        one(&total, &[("data-ns", "clicks")]).text,
        thousands(n(&top["total"]))
    );

    // A key, in UTC and in New York over its fall-back day.
    for (view, buckets) in [(UTC_DAY, 24), (NY_DAY, 25)] {
        let (status, dash) = get(
            &base,
            &format!(
                "/v1/ns/clicks/keys/lnk_1/dashboard?limit=10&{}",
                api_params(view)
            ),
            None,
        );
        assert_eq!(status, 200, "{dash}");
        let dom = dump_dom(
            &chrome,
            &profile,
            &format!("{base}/#/key/clicks/lnk_1?{view}"),
        );
        let total = by_testid(&dom, "total");
        assert_eq!(total.len(), 1);
        assert_eq!(total[0].text, thousands(n(&dash["total"])), "{view}");
        assert_eq!(total[0].text, "2,234");
        let timeline = dash["timeline"].as_array().unwrap();
        assert_eq!(timeline.len(), buckets, "{view}");
        let bars = by_testid(&dom, "bucket");
        let shown: Vec<(&str, &str)> = bars
            .iter()
            .map(|b| (b.attrs["data-t"].as_str(), b.attrs["data-n"].as_str()))
            .collect();
        let api: Vec<(&str, String)> = timeline
            .iter()
            .map(|p| (p["t"].as_str().unwrap(), n(&p["n"]).to_string()))
            .collect();
        assert_eq!(
            shown,
            api.iter()
                .map(|(t, n)| (*t, n.as_str()))
                .collect::<Vec<_>>(),
            "{view}: the bars are the API's buckets"
        );
        let one_am = bars
            .iter()
            .filter(|b| b.attrs["data-label"] == "01:00")
            .count();
        assert_eq!(one_am, buckets - 23, "{view}: hours labelled 01:00");
        let breakdown = by_testid(&dom, "breakdown-n");
        for (dim, b) in dash["breakdowns"].as_object().unwrap() {
            for v in b["values"].as_array().unwrap() {
                let value = v["value"].as_str().unwrap();
                let el = one(&breakdown, &[("data-dim", dim), ("data-value", value)]);
                assert_eq!(el.text, thousands(n(&v["n"])), "{view}: {dim}={value}");
            }
            for kind in ["other", "unset"] {
                let el = one(&breakdown, &[("data-dim", dim), ("data-kind", kind)]);
                assert_eq!(el.text, thousands(n(&b[kind])), "{view}: {dim} {kind}");
            }
        }
        let compound = one(
            &breakdown,
            &[("data-dim", "country+device"), ("data-value", "US|mobile")],
        );
        assert_eq!(compound.text, "1,200");
        let unset = one(
            &breakdown,
            &[("data-dim", "device"), ("data-kind", "unset")],
        );
        assert_eq!(unset.text, "1,000");
        // The rolling windows: what the window query answers (these events are long past).
        let windows = by_testid(&dom, "window");
        for last in ["1m", "1h", "1d"] {
            let (status, w) = get(
                &base,
                &format!("/v1/ns/clicks/keys/lnk_1/window?last={last}"),
                None,
            );
            assert_eq!(status, 200, "{w}");
            assert_eq!(
                one(&windows, &[("data-last", last)]).text,
                thousands(n(&w["n"]))
            );
        }
    }

    // The keys `.` and `..` cannot be URL path segments (dot segments are dropped, even
    // percent-encoded): the page asks for them through POST /v1/query and shows its answers.
    let resp = agent
        .post(format!("{base}/v1/events"))
        .header("Content-Type", "application/json")
        .send(
            r#"[{"ns": "clicks", "key": ".", "ts": "2025-11-02T10:00:00Z", "n": 3},
                {"ns": "clicks", "key": "..", "ts": "2025-11-02T11:00:00Z", "n": 4,
                 "dims": {"country": "FR"}}]"#,
        )
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    for (key, total) in [(".", "3"), ("..", "4")] {
        let dom = dump_dom(
            &chrome,
            &profile,
            &format!("{base}/#/key/clicks/{key}?{UTC_DAY}"),
        );
        assert!(by_testid(&dom, "error").is_empty(), "{key}: {dom}");
        assert_eq!(by_testid(&dom, "total")[0].text, total, "{key}");
        assert_eq!(by_testid(&dom, "bucket").len(), 24, "{key}");
        assert_eq!(by_testid(&dom, "window").len(), 3, "{key}");
    }
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/key/clicks/..?{UTC_DAY}"),
    );
    let fr = by_testid(&dom, "breakdown-n");
    assert_eq!(
        one(&fr, &[("data-dim", "country"), ("data-value", "FR")]).text,
        "4"
    );

    // Hours over more than one day are labelled with their date.
    let two_days = UTC_DAY.replace("2025-11-03T", "2025-11-04T");
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/key/clicks/lnk_1?{two_days}"),
    );
    let bars = by_testid(&dom, "bucket");
    assert_eq!(bars.len(), 48);
    assert!(
        bars[5].attrs["data-t"].starts_with("2025-11-02T05:00")
            && bars[5].attrs["data-label"] == "11-02 05:00",
        "{:?}",
        bars[5]
    );

    // "This month" by the hour starts at local midnight of the 1st (by the offset then: in
    // New York, November's 1st is often still on summer time).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (status, month) = get(
        &base,
        &format!(
            "/v1/ns/clicks/keys/lnk_1/series?from={now}&to={}&unit=month&tz=America%2FNew_York",
            now + 1
        ),
        None,
    );
    assert_eq!(status, 200, "{month}");
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/key/clicks/lnk_1?range=month&unit=hour&tz=America/New_York"),
    );
    assert_eq!(
        by_testid(&dom, "from")[0].attrs["datetime"],
        month["from_t"].as_str().unwrap(),
        "{dom}"
    );

    // Too many buckets for one bar each: the page says so and draws none; the total stays.
    let months = "range=custom&from=2025-08-01T00:00:00Z&to=2025-12-01T00:00:00Z&unit=hour&tz=UTC";
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/key/clicks/lnk_1?{months}"),
    );
    let note = by_testid(&dom, "too-many");
    assert_eq!(note.len(), 1, "{dom}");
    assert_eq!(note[0].attrs["data-buckets"], "2928");
    assert!(by_testid(&dom, "bucket").is_empty());
    assert_eq!(by_testid(&dom, "total")[0].text, "2,234");

    // A range no tier covers at this unit: the page shows the API's own message.
    let minutes = UTC_DAY.replace("unit=hour", "unit=minute");
    let (status, err) = get(
        &base,
        &format!("/v1/ns/clicks/keys/lnk_1/series?{}", api_params(&minutes)),
        None,
    );
    assert_eq!(status, 422, "{err}");
    assert_eq!(err["error"]["code"], "no_tier_for_range");
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/key/clicks/lnk_1?{minutes}"),
    );
    let shown = by_testid(&dom, "error");
    assert!(
        shown
            .iter()
            .any(|e| e.attrs["data-code"] == "no_tier_for_range"
                && e.text == err["error"]["message"].as_str().unwrap()),
        "{shown:?} lacks {err}"
    );
    assert!(
        by_testid(&dom, "total").is_empty(),
        "no number next to an error"
    );

    // An empty range says so.
    let empty = UTC_DAY
        .replace("2025-11-02T", "2025-10-02T")
        .replace("2025-11-03T", "2025-10-03T");
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/key/clicks/lnk_1?{empty}"),
    );
    assert_eq!(by_testid(&dom, "total")[0].text, "0");
    assert_eq!(
        by_testid(&dom, "empty")[0].text,
        "No events for this key in this range."
    );

    // Key search pages with the API's cursor.
    let (_, page) = get(&base, "/v1/ns/clicks/keys?prefix=lnk&limit=50", None);
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/keys/clicks?prefix=lnk"),
    );
    let links: Vec<String> = by_testid(&dom, "key-link")
        .into_iter()
        .map(|e| e.text)
        .collect();
    let api: Vec<String> = page["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(links, api);
    assert_eq!(links, ["lnk_1", "lnk_2", "lnk_big"]);
    let dom = dump_dom(
        &chrome,
        &profile,
        &format!("{base}/#/keys/clicks?prefix=lnk&after=lnk_1"),
    );
    let links: Vec<String> = by_testid(&dom, "key-link")
        .into_iter()
        .map(|e| e.text)
        .collect();
    assert_eq!(links, ["lnk_2", "lnk_big"]);
    sigterm_and_wait(s);

    // Many namespaces: the overview asks for the top keys of the first 24 by itself (each
    // is a scan of its namespace) and gives the others a button.
    let dir = tempfile::tempdir().unwrap();
    let s = serve_config(dir.path(), "");
    let base = s.url.trim_end_matches('/').to_owned();
    let mut events: Vec<String> = (0..26)
        .map(|i| format!(r#"{{"ns": "n{i:02}", "key": "k", "ts": "2025-11-02T10:00:00Z"}}"#))
        .collect();
    // A count past 2^53, which a browser's numbers cannot hold exactly, is marked so.
    let big = r#"{"ns": "n00", "key": "big", "ts": "2025-11-02T10:00:00Z", "n": 9007199254740991}"#;
    events.extend([big.to_owned(), big.to_owned()]);
    let resp = agent
        .post(format!("{base}/v1/events"))
        .header("Content-Type", "application/json")
        .send(format!("[{}]", events.join(",")))
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let dom = dump_dom(&chrome, &profile, &format!("{base}/#/?{UTC_DAY}"));
    assert_eq!(by_testid(&dom, "namespace").len(), 26);
    let tops = by_testid(&dom, "top-n");
    let with_tops: std::collections::BTreeSet<&str> =
        tops.iter().map(|t| t.attrs["data-ns"].as_str()).collect();
    assert_eq!(with_tops.len(), 24);
    assert_eq!(by_testid(&dom, "load-top").len(), 2);
    let big = one(&tops, &[("data-ns", "n00"), ("data-key", "big")]);
    assert_eq!(big.text, "≈18,014,398,509,481,982");
    sigterm_and_wait(s);

    // With tokens configured the page asks for one, with the API's 401 message.
    let dir = tempfile::tempdir().unwrap();
    let s = serve_config(
        dir.path(),
        "[[tokens]]\ntoken = \"s3cret\"\nscopes = [\"read:*\"]\n",
    );
    let base = s.url.trim_end_matches('/').to_owned();
    let (status, err) = get(&base, "/v1/ns", None);
    assert_eq!(status, 401);
    let dom = dump_dom(&chrome, &profile, &format!("{base}/"));
    assert_eq!(by_testid(&dom, "token-form").len(), 1, "{dom}");
    let shown = by_testid(&dom, "error");
    assert_eq!(shown[0].text, err["error"]["message"].as_str().unwrap());
    assert_eq!(shown[0].attrs["data-code"], "unauthorized");
    sigterm_and_wait(s);
}
