//! `tally query {series,breakdown,window,dashboard,top}`: one clap subcommand per kind of
//! query, each with its own flags, its route (SPEC §3) and its answer type.

use tally_core::query::{BreakdownAnswer, DashboardAnswer, SeriesAnswer, TopAnswer, WindowAnswer};

use crate::conn::Conn;
use crate::http::Route;

#[derive(Debug, clap::Subcommand)]
pub enum QueryCommand {
    /// Counts per calendar bucket.
    Series(SeriesArgs),
    /// Top values of one dimension.
    Breakdown(BreakdownArgs),
    /// Rolling count over the last duration.
    Window(WindowArgs),
    /// Timeline and every dimension's breakdown.
    Dashboard(DashboardArgs),
    /// Top keys of a namespace.
    Top(TopArgs),
}

pub fn run(q: QueryCommand) -> anyhow::Result<()> {
    match q {
        QueryCommand::Series(q) => q.conn.get::<SeriesAnswer>(&q.route()),
        QueryCommand::Breakdown(q) => q.conn.get::<BreakdownAnswer>(&q.route()),
        QueryCommand::Window(q) => q.conn.get::<WindowAnswer>(&q.route()),
        QueryCommand::Dashboard(q) => q.conn.get::<DashboardAnswer>(&q.route()),
        QueryCommand::Top(q) => q.conn.get::<TopAnswer>(&q.route()),
    }
}

/// The calendar range most queries take.
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

impl Range {
    /// Adds `from`, `to` and `tz` to a query's route.
    fn on(&self, route: Route) -> Route {
        route
            .param("from", &self.from)
            .param("to", &self.to)
            .opt("tz", self.tz.as_deref())
    }
}

#[derive(Debug, clap::Args)]
pub struct SeriesArgs {
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
}

impl SeriesArgs {
    fn route(&self) -> Route {
        self.range
            .on(Route::key(&self.ns, &self.key, "series"))
            .param("unit", &self.unit)
            .opt("every", self.every)
            .opt("dim", self.dim.as_deref())
            .opt("value", self.value.as_deref())
    }
}

#[derive(Debug, clap::Args)]
pub struct BreakdownArgs {
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
}

impl BreakdownArgs {
    fn route(&self) -> Route {
        self.range
            .on(Route::key(&self.ns, &self.key, "breakdown"))
            .param("dim", &self.dim)
            .opt("unit", self.unit.as_deref())
            .opt("limit", self.limit)
    }
}

#[derive(Debug, clap::Args)]
pub struct WindowArgs {
    ns: String,
    key: String,
    #[arg(long)]
    last: String,
    #[command(flatten)]
    conn: Conn,
}

impl WindowArgs {
    fn route(&self) -> Route {
        Route::key(&self.ns, &self.key, "window").param("last", &self.last)
    }
}

#[derive(Debug, clap::Args)]
pub struct DashboardArgs {
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
}

impl DashboardArgs {
    fn route(&self) -> Route {
        self.range
            .on(Route::key(&self.ns, &self.key, "dashboard"))
            .param("unit", &self.unit)
            .opt("every", self.every)
            .opt("limit", self.limit)
    }
}

#[derive(Debug, clap::Args)]
pub struct TopArgs {
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
}

impl TopArgs {
    fn route(&self) -> Route {
        self.range
            .on(Route::namespace(&self.ns, "top"))
            .opt("unit", self.unit.as_deref())
            .opt("limit", self.limit)
            .opt("dim", self.dim.as_deref())
            .opt("value", self.value.as_deref())
    }
}
