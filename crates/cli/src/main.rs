//! `tally`: runs the server (`tally serve`), talks to one (`incr`, `query …`, `keys`, `bench`), and
//! looks after a data directory (`check`, `compact`, `backup`), and loads and exports history (`load`, `export`).
//! This file is glue: clap parses and checks every argument before anything runs, `cmd` runs
//! the subcommand, and an error prints as one line with its causes and exits 1 (clap's own
//! refusals exit 2; a limited `incr` refused exits 3). A closed stdout is success.

// The workspace denies `unsafe`; only the engine has a site that allows it.
#![forbid(unsafe_code)]

mod cmd;
mod conn;
mod http;
mod load;
mod parts;
mod table;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "tally", version, about = "A time-series counter database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// For the commands that talk to an https server: trust the certificates in this PEM
    /// file (a private CA, or the server's self-signed certificate) instead of the usual
    /// public roots.
    #[arg(long, global = true, env = "TALLY_CA_CERT", value_name = "PEM")]
    ca_cert: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server (the embedded engine on ./tally-data by default).
    Serve(cmd::serve::ServeArgs),
    /// Add to a key's count.
    Incr(cmd::incr::IncrArgs),
    /// Ask a running server.
    #[command(subcommand)]
    Query(cmd::query::QueryCommand),
    /// List a namespace's keys.
    Keys(cmd::keys::KeysArgs),
    /// Verify every checksum of a data directory; non-zero exit on damage.
    Check(cmd::check::CheckArgs),
    /// Flush every closed period of a stopped server's data directory into the archive.
    Compact(cmd::compact::CompactArgs),
    /// Bulk-load events from CSV or NDJSON files into a server or a data directory.
    Load(cmd::load::LoadArgs),
    /// Export a namespace's counts as Hive-partitioned Parquet or CSV files.
    Export(cmd::export::ExportArgs),
    /// Copy a data directory consistently, even while a server runs on it.
    Backup(cmd::backup::BackupArgs),
    /// Load a running server with a mix of writes and queries; report rates and latencies.
    Bench(cmd::bench::BenchArgs),
}

/// Raises the soft limit on open files to the hard one. Every connection holds a descriptor,
/// and so do the archive segment files an engine keeps open (at most a quarter of the
/// limit: `segment::files`, which reads the limit once, after this): 1024, a common default
/// soft limit, makes a small server. The hard limit is what the operator allows; `tally
/// serve` logs the limit it runs with.
fn raise_open_files_limit() {
    // Failing leaves the limit as it was, which is all one can do.
    let _ = rlimit::increase_nofile_limit(u64::MAX);
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    raise_open_files_limit();
    // Only where an https server may be asked: a bad TALLY_CA_CERT in the environment must
    // not stop a server or a check of a data directory.
    let local = matches!(
        cli.command,
        Command::Serve(_) | Command::Check(_) | Command::Backup(_)
    );
    if let Some(path) = cli.ca_cert.as_ref().filter(|_| !local)
        && let Err(e) = http::trust_ca_certs(path)
    {
        eprintln!("tally: --ca-cert: {e:#}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Serve(args) => cmd::serve::run(args),
        Command::Incr(args) => cmd::incr::run(args),
        Command::Query(query) => cmd::query::run(query),
        Command::Keys(args) => cmd::keys::run(args),
        Command::Check(args) => cmd::check::run(args),
        Command::Compact(args) => cmd::compact::run(args),
        Command::Load(args) => cmd::load::run(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Backup(args) => cmd::backup::run(args),
        Command::Bench(args) => cmd::bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.chain().any(|c| c.is::<conn::StdoutClosed>()) => ExitCode::SUCCESS,
        // A limited increment refused: an answer, not a failure of the tool.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<http::ServerError>()
                    .is_some_and(|s| s.code == "limit_exceeded")
            }) =>
        {
            eprintln!("tally: {e:#}");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("tally: {e:#}");
            ExitCode::FAILURE
        }
    }
}
