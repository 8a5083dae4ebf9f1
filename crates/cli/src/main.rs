//! `tally`: runs the server (`tally serve`) and talks to one (`incr`, `query`, `keys`).
//! Arguments are parsed and validated before anything runs; errors print as one line (with
//! their causes) and exit non-zero; a closed pipe is success.

mod client;
mod cmd;
mod http;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "tally", version, about = "A time-series counter database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (the embedded engine on ./tally-data by default).
    Serve(cmd::serve::ServeArgs),
    /// Add to a key's count.
    Incr(client::IncrArgs),
    /// Ask a running server.
    #[command(subcommand)]
    Query(client::QueryCommand),
    /// List a namespace's keys.
    Keys(client::KeysArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args),
        Command::Incr(args) => client::incr(args),
        Command::Query(q) => client::query(q),
        Command::Keys(args) => client::keys(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tally: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
