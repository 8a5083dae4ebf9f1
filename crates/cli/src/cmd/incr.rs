//! `tally incr`: one event through `POST /v1/ns/{ns}/keys/{key}/incr`, and the rolling
//! count after it with `--window`; with `--max` too, only if that count stays within it
//! (exit status 3 when refused).

use tally_core::query::Accepted;

use crate::conn::Conn;
use crate::http::Route;

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
    /// Count only if the rolling count over --window stays at most this; else nothing is
    /// counted and the exit status is 3 (a rate limiter's "no").
    #[arg(long, requires = "window")]
    max: Option<i64>,
    #[command(flatten)]
    conn: Conn,
}

fn parse_dim(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .ok_or_else(|| format!("{s:?} is not name=value"))
}

pub fn run(a: IncrArgs) -> anyhow::Result<()> {
    let mut route = Route::key(&a.ns, &a.key, "incr")
        .opt("n", a.n)
        .opt("ts", a.ts.as_deref())
        .opt("window", a.window.as_deref())
        .opt("max", a.max);
    for (name, value) in &a.dims {
        route = route.param(&format!("dim.{name}"), value);
    }
    a.conn.post::<Accepted>(&route)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dimension_is_name_equals_value_split_at_the_first_equals() {
        assert_eq!(
            parse_dim("referrer=a=b"),
            Ok(("referrer".to_owned(), "a=b".to_owned()))
        );
        assert!(parse_dim("country").is_err());
    }
}
