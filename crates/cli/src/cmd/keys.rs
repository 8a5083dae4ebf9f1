//! `tally keys`: a namespace's keys in byte order through `GET /v1/ns/{ns}/keys`, one page
//! at a time (`--after` the last key shown).

use tally_core::query::KeysAnswer;

use crate::conn::Conn;
use crate::http::Route;

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

pub fn run(a: KeysArgs) -> anyhow::Result<()> {
    let route = Route::namespace(&a.ns, "keys")
        .opt("prefix", a.prefix.as_deref())
        .opt("after", a.after.as_deref())
        .opt("limit", a.limit);
    a.conn.get::<KeysAnswer>(&route)
}
