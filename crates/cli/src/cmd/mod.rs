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
/// (`tally load --data` may make a new one: loading history into it is what it is for).
pub(crate) fn existing_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir.join("wal")) {
        Ok(m) if m.is_dir() => Ok(()),
        // Not "it has no wal/" when the directory cannot be looked into at all.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            anyhow::bail!("{}: {e}", dir.display())
        }
        _ => anyhow::bail!(
            "{} is not a tally data directory (it has no wal/): give the directory `tally \
             serve --data` uses",
            dir.display()
        ),
    }
}
