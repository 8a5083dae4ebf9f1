//! The subcommands, one module each, and what the client commands (`incr`, `query …`,
//! `keys`) share: the connection flags ([`Conn`]) and printing an answer — the server's JSON
//! with `--json`, else the answer's table.

pub mod incr;
pub mod keys;
pub mod query;
pub mod serve;

use std::io::Write;

use serde::de::DeserializeOwned;

use crate::http::{Answer, Client, Route};
use crate::table::Render;

/// Where the server is, how to authenticate, and how to print its answer.
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
