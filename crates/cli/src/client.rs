//! The client commands: `incr`, `query …`, `keys` against a running server. Human tables by
//! default, the server's JSON with `--json`.

use std::io::Write;

use serde_json::Value;

use crate::http::{Client, Route};

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

impl Conn {
    fn client(&self) -> Client {
        Client::new(&self.server, self.token.as_deref())
    }
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
    let mut route = Route::key(&a.ns, &a.key, "incr")
        .opt("n", a.n)
        .opt("ts", a.ts.as_deref())
        .opt("window", a.window.as_deref());
    for (name, value) in &a.dims {
        route = route.param(&format!("dim.{name}"), value);
    }
    let answer = a.conn.client().post::<Value>(&route)?;
    if a.conn.json {
        return print_json(answer.json());
    }
    let v = answer.typed()?;
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
    /// Adds `from`, `to` and `tz` to a query's route.
    fn on(&self, route: Route) -> Route {
        route
            .param("from", &self.from)
            .param("to", &self.to)
            .opt("tz", self.tz.as_deref())
    }
}

pub fn query(q: QueryCommand) -> anyhow::Result<()> {
    let (conn, kind, route) = match &q {
        QueryCommand::Series {
            ns,
            key,
            range,
            unit,
            every,
            dim,
            value,
            conn,
        } => (
            conn,
            "series",
            range
                .on(Route::key(ns, key, "series"))
                .param("unit", unit)
                .opt("every", *every)
                .opt("dim", dim.as_deref())
                .opt("value", value.as_deref()),
        ),
        QueryCommand::Breakdown {
            ns,
            key,
            dim,
            range,
            unit,
            limit,
            conn,
        } => (
            conn,
            "breakdown",
            range
                .on(Route::key(ns, key, "breakdown"))
                .param("dim", dim)
                .opt("unit", unit.as_deref())
                .opt("limit", *limit),
        ),
        QueryCommand::Window {
            ns,
            key,
            last,
            conn,
        } => (
            conn,
            "window",
            Route::key(ns, key, "window").param("last", last),
        ),
        QueryCommand::Dashboard {
            ns,
            key,
            range,
            unit,
            every,
            limit,
            conn,
        } => (
            conn,
            "dashboard",
            range
                .on(Route::key(ns, key, "dashboard"))
                .param("unit", unit)
                .opt("every", *every)
                .opt("limit", *limit),
        ),
        QueryCommand::Top {
            ns,
            range,
            unit,
            limit,
            dim,
            value,
            conn,
        } => (
            conn,
            "top",
            range
                .on(Route::namespace(ns, "top"))
                .opt("unit", unit.as_deref())
                .opt("limit", *limit)
                .opt("dim", dim.as_deref())
                .opt("value", value.as_deref()),
        ),
    };
    let answer = conn.client().get::<Value>(&route)?;
    if conn.json {
        return print_json(answer.json());
    }
    let v = answer.typed()?;
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
    let route = Route::namespace(&a.ns, "keys")
        .opt("prefix", a.prefix.as_deref())
        .opt("after", a.after.as_deref())
        .opt("limit", a.limit);
    let answer = a.conn.client().get::<Value>(&route)?;
    if a.conn.json {
        return print_json(answer.json());
    }
    let v = answer.typed()?;
    let mut o = out();
    for k in v["keys"].as_array().into_iter().flatten() {
        writeln!(o, "{}", s(k))?;
    }
    if let Some(next) = v["next"].as_str() {
        writeln!(o, "(more: --after {next})")?;
    }
    Ok(())
}
