//! The subcommands, one module each; what the client commands share is in `conn`.

pub mod backup;
pub mod bench;
pub mod check;
pub mod compact;
pub mod export;
pub mod incr;
pub mod keys;
pub mod load;
pub mod query;
pub mod serve;

/// Refuses a `--data` path that is not a data directory a server made (it has a `wal/`):
/// the commands that read or maintain one must not create one where a path was mistyped
/// (`tally load --data` makes a new one only when asked, with `--create`).
pub(crate) fn existing_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    if !is_data_dir(dir)? {
        anyhow::bail!("{}", not_a_data_dir(dir));
    }
    Ok(())
}

/// Whether `dir` is a data directory a server made (it has a `wal/`); an error when it
/// cannot be looked into at all (then it is not "it has no wal/").
pub(crate) fn is_data_dir(dir: &std::path::Path) -> anyhow::Result<bool> {
    match std::fs::metadata(dir.join("wal")) {
        Ok(m) => Ok(m.is_dir()),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            anyhow::bail!("{}: {e}", dir.display())
        }
        Err(_) => Ok(false),
    }
}

/// Why `dir` is refused as a data directory.
pub(crate) fn not_a_data_dir(dir: &std::path::Path) -> String {
    format!(
        "{} is not a tally data directory (it has no wal/): give the directory `tally serve \
         --data` uses",
        dir.display()
    )
}
