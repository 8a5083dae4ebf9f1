//! The client commands: `incr`, `query …`, `keys` against a running server. Human tables by
//! default, the server's JSON with `--json`.

use std::io::Write;

use anyhow::{Context, bail};
use serde_json::Value;

#[derive(Debug, clap::Args)]
pub struct Conn {
    /// The server.
    #[arg(
        long,
        env = "TALLY_SERVER",
        default_value = "http://127.0.0.1:7070",
        global = true
    )]
    server: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "TALLY_TOKEN", global = true)]
    token: Option<String>,
    /// Print the server's JSON answer instead of a table.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct IncrArgs {
    ns: String,
    key: String,
    /// Amount (default 1; may be negative).
    #[arg(short, long, allow_hyphen_values = true)]
    n: Option<i64>,
    /// Unix seconds or RFC 3339 (default now).
    #[arg(long)]
    ts: Option<String>,
    /// A dimension, `name=value`; repeatable.
    #[arg(long = "dim", value_parser = parse_dim)]
    dims: Vec<(String, String)>,
    /// Also answer the rolling count over this duration (e.g. 1h).
    #[arg(long)]
    window: Option<String>,
    #[command(flatten)]
    conn: Conn,
}

fn parse_dim(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .ok_or_else(|| format!("{s:?} is not name=value"))
}

#[derive(Debug, clap::Args)]
pub struct Range {
    /// Start (unix seconds or RFC 3339), floored to the unit.
    #[arg(long)]
    from: String,
    /// End, exclusive, ceiled to the unit.
    #[arg(long)]
    to: String,
    /// IANA time zone.
    #[arg(long)]
    tz: Option<String>,
}

#[derive(Debug, clap::Subcommand)]
pub enum QueryCommand {
    /// Counts per calendar bucket.
    Series {
        ns: String,
        key: String,
        #[command(flatten)]
        range: Range,
        #[arg(long)]
        unit: String,
        #[arg(long)]
        every: Option<u32>,
        #[arg(long)]
        dim: Option<String>,
        #[arg(long)]
        value: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Top values of one dimension.
    Breakdown {
        ns: String,
        key: String,
        #[arg(long)]
        dim: String,
        #[command(flatten)]
        range: Range,
        #[arg(long)]
        unit: Option<String>,
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Rolling count over the last duration.
    Window {
        ns: String,
        key: String,
        #[arg(long)]
        last: String,
        #[command(flatten)]
        conn: Conn,
    },
    /// Timeline and every dimension's breakdown.
    Dashboard {
        ns: String,
        key: String,
        #[command(flatten)]
        range: Range,
        #[arg(long)]
        unit: String,
        #[arg(long)]
        every: Option<u32>,
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Top keys of a namespace.
    Top {
        ns: String,
        #[command(flatten)]
        range: Range,
        #[arg(long)]
        unit: Option<String>,
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        dim: Option<String>,
        #[arg(long)]
        value: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
}

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    ns: String,
    #[arg(long)]
    prefix: Option<String>,
    #[arg(long)]
    after: Option<String>,
    #[arg(long)]
    limit: Option<u32>,
    #[command(flatten)]
    conn: Conn,
}

/// Percent-encodes a path segment or a query value.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn query_string(params: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = params
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{}={}", enc(k), enc(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn call(conn: &Conn, method: &str, path_and_query: &str) -> anyhow::Result<Value> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let url = format!("{}{}", conn.server.trim_end_matches('/'), path_and_query);
    let auth = conn.token.as_ref().map(|t| format!("Bearer {t}"));
    let resp = match method {
        "POST" => {
            let mut r = agent.post(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.send_empty()
        }
        _ => {
            let mut r = agent.get(&url);
            if let Some(a) = &auth {
                r = r.header("Authorization", a);
            }
            r.call()
        }
    };
    let mut resp = resp.with_context(|| format!("cannot reach the server at {}", conn.server))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .context("reading the answer")?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("the server answered {status} with non-JSON: {text}"))?;
    if status >= 400 {
        let code = v["error"]["code"].as_str().unwrap_or("error");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        bail!("{code}: {msg} (HTTP {status})");
    }
    Ok(v)
}

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

fn print_json(v: &Value) -> anyhow::Result<()> {
    writeln!(out(), "{}", serde_json::to_string_pretty(v)?)?;
    Ok(())
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// Prints rows as left-aligned columns.
fn table(rows: &[Vec<String>]) -> anyhow::Result<()> {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|x| x.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut o = out();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, x)| format!("{x:<w$}", w = widths[i]))
            .collect();
        writeln!(o, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}

pub fn incr(a: IncrArgs) -> anyhow::Result<()> {
    let mut params: Vec<(String, Option<String>)> = vec![
        ("n".into(), a.n.map(|n| n.to_string())),
        ("ts".into(), a.ts.clone()),
        ("window".into(), a.window.clone()),
    ];
    for (k, v) in &a.dims {
        params.push((format!("dim.{k}"), Some(v.clone())));
    }
    let borrowed: Vec<(&str, Option<String>)> = params
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    let path = format!(
        "/v1/ns/{}/keys/{}/incr{}",
        enc(&a.ns),
        enc(&a.key),
        query_string(&borrowed)
    );
    let v = call(&a.conn, "POST", &path)?;
    if a.conn.json {
        return print_json(&v);
    }
    let mut o = out();
    writeln!(o, "accepted {}", s(&v["accepted"]))?;
    if let Some(w) = v.get("window") {
        writeln!(
            o,
            "last {}: {} (from {}, {} buckets)",
            s(&w["last"]),
            s(&w["n"]),
            s(&w["from_t"]),
            s(&w["resolution"])
        )?;
    }
    Ok(())
}

fn points_table(v: &Value, field: &str) -> anyhow::Result<()> {
    let mut rows = vec![vec!["t".to_owned(), "n".to_owned()]];
    for p in v[field].as_array().into_iter().flatten() {
        rows.push(vec![s(&p["t"]), s(&p["n"])]);
    }
    rows.push(vec!["total".into(), s(&v["total"])]);
    table(&rows)
}

fn breakdown_table(v: &Value) -> anyhow::Result<()> {
    let mut rows = vec![vec![s(&v["dim"]), "n".to_owned()]];
    for x in v["values"].as_array().into_iter().flatten() {
        rows.push(vec![s(&x["value"]), s(&x["n"])]);
    }
    rows.push(vec!["(other)".into(), s(&v["other"])]);
    rows.push(vec!["(unset)".into(), s(&v["unset"])]);
    rows.push(vec!["total".into(), s(&v["total"])]);
    table(&rows)
}

impl Range {
    /// `from`, `to`, `tz`, then the query's own parameters.
    fn with(
        &self,
        own: Vec<(&'static str, Option<String>)>,
    ) -> Vec<(&'static str, Option<String>)> {
        let mut p = vec![
            ("from", Some(self.from.clone())),
            ("to", Some(self.to.clone())),
            ("tz", self.tz.clone()),
        ];
        p.extend(own);
        p
    }
}

/// One query's route: the namespace, the key for per-key kinds, and the parameters.
struct Route<'a> {
    conn: &'a Conn,
    ns: &'a str,
    key: Option<&'a str>,
    kind: &'static str,
    params: Vec<(&'static str, Option<String>)>,
}

pub fn query(q: QueryCommand) -> anyhow::Result<()> {
    let num = |x: &Option<u32>| x.map(|v| v.to_string());
    let r = match &q {
        QueryCommand::Series {
            ns,
            key,
            range,
            unit,
            every,
            dim,
            value,
            conn,
        } => Route {
            conn,
            ns,
            key: Some(key),
            kind: "series",
            params: range.with(vec![
                ("unit", Some(unit.clone())),
                ("every", num(every)),
                ("dim", dim.clone()),
                ("value", value.clone()),
            ]),
        },
        QueryCommand::Breakdown {
            ns,
            key,
            dim,
            range,
            unit,
            limit,
            conn,
        } => Route {
            conn,
            ns,
            key: Some(key),
            kind: "breakdown",
            params: range.with(vec![
                ("dim", Some(dim.clone())),
                ("unit", unit.clone()),
                ("limit", num(limit)),
            ]),
        },
        QueryCommand::Window {
            ns,
            key,
            last,
            conn,
        } => Route {
            conn,
            ns,
            key: Some(key),
            kind: "window",
            params: vec![("last", Some(last.clone()))],
        },
        QueryCommand::Dashboard {
            ns,
            key,
            range,
            unit,
            every,
            limit,
            conn,
        } => Route {
            conn,
            ns,
            key: Some(key),
            kind: "dashboard",
            params: range.with(vec![
                ("unit", Some(unit.clone())),
                ("every", num(every)),
                ("limit", num(limit)),
            ]),
        },
        QueryCommand::Top {
            ns,
            range,
            unit,
            limit,
            dim,
            value,
            conn,
        } => Route {
            conn,
            ns,
            key: None,
            kind: "top",
            params: range.with(vec![
                ("unit", unit.clone()),
                ("limit", num(limit)),
                ("dim", dim.clone()),
                ("value", value.clone()),
            ]),
        },
    };
    let (conn, kind) = (r.conn, r.kind);
    let path = match r.key {
        Some(k) => format!(
            "/v1/ns/{}/keys/{}/{kind}{}",
            enc(r.ns),
            enc(k),
            query_string(&r.params)
        ),
        None => format!("/v1/ns/{}/{kind}{}", enc(r.ns), query_string(&r.params)),
    };
    let v = call(conn, "GET", &path)?;
    if conn.json {
        return print_json(&v);
    }
    match kind {
        "series" => points_table(&v, "points"),
        "breakdown" => breakdown_table(&v),
        "window" => {
            writeln!(
                out(),
                "last {}: {} (from {}, {} buckets)",
                s(&v["last"]),
                s(&v["n"]),
                s(&v["from_t"]),
                s(&v["resolution"])
            )?;
            Ok(())
        }
        "dashboard" => {
            points_table(&v, "timeline")?;
            for (_, b) in v["breakdowns"].as_object().into_iter().flatten() {
                writeln!(out())?;
                breakdown_table(b)?;
            }
            Ok(())
        }
        _ => {
            let mut rows = vec![vec!["key".to_owned(), "n".to_owned()]];
            for k in v["keys"].as_array().into_iter().flatten() {
                rows.push(vec![s(&k["key"]), s(&k["n"])]);
            }
            rows.push(vec!["(other)".into(), s(&v["other"])]);
            rows.push(vec!["total".into(), s(&v["total"])]);
            table(&rows)
        }
    }
}

pub fn keys(a: KeysArgs) -> anyhow::Result<()> {
    let path = format!(
        "/v1/ns/{}/keys{}",
        enc(&a.ns),
        query_string(&[
            ("prefix", a.prefix.clone()),
            ("after", a.after.clone()),
            ("limit", a.limit.map(|l| l.to_string()))
        ])
    );
    let v = call(&a.conn, "GET", &path)?;
    if a.conn.json {
        return print_json(&v);
    }
    let mut o = out();
    for k in v["keys"].as_array().into_iter().flatten() {
        writeln!(o, "{}", s(k))?;
    }
    if let Some(next) = v["next"].as_str() {
        writeln!(o, "(more: --after {next})")?;
    }
    Ok(())
}
