//! What the client commands (`incr`, `query …`, `keys`) share: the connection flags
//! ([`Conn`]) and printing an answer — the server's JSON with `--json`, else the answer's
//! table — to a stdout its reader may close ([`StdoutClosed`]).

use std::fmt;
use std::io::{self, Write};

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
        global = true,
        value_parser = crate::http::server_url
    )]
    server: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "TALLY_TOKEN", hide_env_values = true, global = true, value_parser = crate::http::token)]
    token: Option<String>,
    /// Print JSON instead of a table: the server's answer as it came (for `bench`, its
    /// report).
    #[arg(long, global = true)]
    json: bool,
}

impl Conn {
    /// GETs `route` and prints the answer, read as a `T`.
    pub(crate) fn get<T: DeserializeOwned + Render>(&self, route: &Route) -> anyhow::Result<()> {
        self.print(self.client().get::<T>(route))
    }

    /// POSTs to `route` and prints the answer, read as a `T`.
    pub(crate) fn post<T: DeserializeOwned + Render>(&self, route: &Route) -> anyhow::Result<()> {
        self.print(self.client().post::<T>(route))
    }

    pub(crate) fn client(&self) -> Client {
        Client::new(&self.server, self.token.as_deref())
    }

    /// A client whose requests give up after `timeout`.
    pub(crate) fn client_with_timeout(&self, timeout: std::time::Duration) -> Client {
        Client::with_timeout(&self.server, self.token.as_deref(), Some(timeout))
    }

    /// The server's URL, as the user gave it.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// Whether `--json` was given.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    /// With `--json` the server's JSON as it came (pretty-printed), an error answer's too
    /// (then the error is still returned: its line on stderr, its exit status), else a table.
    pub(crate) fn print<T: DeserializeOwned + Render>(
        &self,
        answer: anyhow::Result<Answer<T>>,
    ) -> anyhow::Result<()> {
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                if self.json
                    && let Some(refused) = e.downcast_ref::<crate::http::ServerError>()
                {
                    let mut text = serde_json::to_string_pretty(&refused.body)?;
                    text.push('\n');
                    write_stdout(&text)?;
                }
                return Err(e);
            }
        };
        let text = if self.json {
            let mut text = serde_json::to_string_pretty(answer.json())?;
            text.push('\n');
            text
        } else {
            answer.typed()?.render()
        };
        write_stdout(&text)
    }
}

/// A command's own report as pretty JSON on stdout: what `--json` prints for the commands
/// that look after data or move it (`check`, `compact`, `backup`, `load`, `export`).
pub(crate) fn write_json(report: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(report)?;
    text.push('\n');
    write_stdout(&text)
}

/// Stdout's reader went away before the answer was written (`tally query … | head`). It has
/// what it wanted, so this is success, not an error: `main` exits 0 without a word.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed")
    }
}

impl std::error::Error for StdoutClosed {}

/// Only a write to stdout can be [`StdoutClosed`]: a broken pipe anywhere else (the server's
/// connection, say) is a real error.
pub(crate) fn write_stdout(text: &str) -> anyhow::Result<()> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        written => Ok(written?),
    }
}
