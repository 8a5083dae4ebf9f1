//! The client commands: `incr`, `query …`, `keys` against a running server. Human tables by
//! default, the server's JSON with `--json`.

use std::io::Write;

use serde::de::DeserializeOwned;
use tally_core::query::{
    Accepted, BreakdownAnswer, DashboardAnswer, KeysAnswer, SeriesAnswer, TopAnswer, WindowAnswer,
};

use crate::http::{Answer, Client, Route};
use crate::table::Render;

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
    /// GETs `route` and prints the answer, read as a `T`.
    fn get<T: DeserializeOwned + Render>(&self, route: &Route) -> anyhow::Result<()> {
        self.print(self.client().get::<T>(route)?)
    }

    /// POSTs to `route` and prints the answer, read as a `T`.
    fn post<T: DeserializeOwned + Render>(&self, route: &Route) -> anyhow::Result<()> {
        self.print(self.client().post::<T>(route)?)
    }

    fn client(&self) -> Client {
        Client::new(&self.server, self.token.as_deref())
    }

    /// With `--json` the server's JSON as it came (pretty-printed), else a table.
    fn print<T: DeserializeOwned + Render>(&self, answer: Answer<T>) -> anyhow::Result<()> {
        let text = if self.json {
            let mut text = serde_json::to_string_pretty(answer.json())?;
            text.push('\n');
            text
        } else {
            answer.typed()?.render()
        };
        std::io::stdout().lock().write_all(text.as_bytes())?;
        Ok(())
    }
}

pub fn incr(a: IncrArgs) -> anyhow::Result<()> {
    let mut route = Route::key(&a.ns, &a.key, "incr")
        .opt("n", a.n)
        .opt("ts", a.ts.as_deref())
        .opt("window", a.window.as_deref());
    for (name, value) in &a.dims {
        route = route.param(&format!("dim.{name}"), value);
    }
    a.conn.post::<Accepted>(&route)
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
    match &q {
        QueryCommand::Series {
            ns,
            key,
            range,
            unit,
            every,
            dim,
            value,
            conn,
        } => conn.get::<SeriesAnswer>(
            &range
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
        } => conn.get::<BreakdownAnswer>(
            &range
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
        } => conn.get::<WindowAnswer>(&Route::key(ns, key, "window").param("last", last)),
        QueryCommand::Dashboard {
            ns,
            key,
            range,
            unit,
            every,
            limit,
            conn,
        } => conn.get::<DashboardAnswer>(
            &range
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
        } => conn.get::<TopAnswer>(
            &range
                .on(Route::namespace(ns, "top"))
                .opt("unit", unit.as_deref())
                .opt("limit", *limit)
                .opt("dim", dim.as_deref())
                .opt("value", value.as_deref()),
        ),
    }
}

pub fn keys(a: KeysArgs) -> anyhow::Result<()> {
    let route = Route::namespace(&a.ns, "keys")
        .opt("prefix", a.prefix.as_deref())
        .opt("after", a.after.as_deref())
        .opt("limit", a.limit);
    a.conn.get::<KeysAnswer>(&route)
}
