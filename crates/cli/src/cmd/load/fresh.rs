//! `tally load --data DIR --create`: the new data directory a load makes, and taking it away
//! again when the load is refused, so that a refused load leaves nothing it made. Without
//! `--create` a path that is not a data directory is refused, as the other offline commands
//! refuse it: a mistyped path must not become a fresh directory holding the history.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// A data directory this load made (or found empty and filled).
pub(super) struct Fresh {
    /// The directory the load was given.
    pub(super) dir: PathBuf,
    /// The first of its ancestors (itself included) that did not exist, up to which a refused
    /// load removes the directories it made; `None` when the directory was there, empty, and
    /// a refused load takes out what it put in it.
    made: Option<PathBuf>,
}

impl Fresh {
    /// Readies `dir` for an offline load: `None` if it is a data directory already; with
    /// `create`, a new one (parents included) where nothing is, or in an empty directory;
    /// else refused.
    pub(super) fn prepare(dir: &Path, create: bool) -> anyhow::Result<Option<Fresh>> {
        if crate::cmd::is_data_dir(dir)? {
            return Ok(None);
        }
        if !create {
            bail!(
                "{}; or --create to make a new one there",
                crate::cmd::not_a_data_dir(dir)
            );
        }
        let made = match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {
                if std::fs::read_dir(dir)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
                    .next()
                    .is_some()
                {
                    bail!(
                        "{} holds files but is not a tally data directory (it has no wal/): \
                         --create makes a new one only where nothing is",
                        dir.display()
                    );
                }
                None
            }
            Ok(_) => bail!("{} is not a directory", dir.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // The first ancestor missing: everything from there down is this load's.
                let top = dir
                    .ancestors()
                    .take_while(|p| {
                        !p.as_os_str().is_empty()
                            && matches!(std::fs::symlink_metadata(p),
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound)
                    })
                    .last()
                    .unwrap_or(dir)
                    .to_path_buf();
                std::fs::create_dir_all(dir)
                    .map_err(|e| anyhow::anyhow!("creating {}: {e}", dir.display()))?;
                Some(top)
            }
            Err(e) => bail!("{}: {e}", dir.display()),
        };
        Ok(Some(Fresh {
            dir: dir.to_path_buf(),
            made,
        }))
    }

    /// Takes away what the load made (call it once the engine is closed): the files a data
    /// directory holds ([`ours`]), then each directory it created, from the data directory
    /// up, while it is empty — so nothing anyone else put there meanwhile goes.
    pub(super) fn undo(self) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            if !ours(&entry.file_name().to_string_lossy()) {
                continue;
            }
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
        let Some(top) = &self.made else {
            return Ok(());
        };
        for d in self.dir.ancestors() {
            if std::fs::remove_dir(d).is_err() || d == top.as_path() {
                break;
            }
        }
        Ok(())
    }
}

/// Whether a name in a data directory is one the engine writes there.
fn ours(name: &str) -> bool {
    matches!(
        name,
        "LOCK" | "wal" | "segments" | "CURRENT" | "CURRENT.tmp"
    ) || name.starts_with("MANIFEST-")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made with its missing parents, and taken away from the first of them; an empty
    /// directory is filled and emptied again; one holding files is not touched.
    #[test]
    fn a_new_directory_goes_as_it_came() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/data");
        assert!(Fresh::prepare(&dir, false).is_err());
        assert!(!tmp.path().join("a").exists());
        let fresh = Fresh::prepare(&dir, true).unwrap().unwrap();
        assert_eq!(fresh.made.as_deref(), Some(tmp.path().join("a").as_path()));
        std::fs::create_dir(dir.join("wal")).unwrap();
        assert!(Fresh::prepare(&dir, false).unwrap().is_none());
        fresh.undo().unwrap();
        assert!(!tmp.path().join("a").exists() && tmp.path().exists());

        // What someone else put in a directory it made stays, with the directories above.
        let fresh = Fresh::prepare(&dir, true).unwrap().unwrap();
        std::fs::create_dir(dir.join("segments")).unwrap();
        std::fs::write(tmp.path().join("a/theirs.txt"), "theirs").unwrap();
        fresh.undo().unwrap();
        assert!(!tmp.path().join("a/b").exists());
        assert!(tmp.path().join("a/theirs.txt").exists());
        std::fs::remove_dir_all(tmp.path().join("a")).unwrap();

        let empty = tmp.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let fresh = Fresh::prepare(&empty, true).unwrap().unwrap();
        std::fs::create_dir(empty.join("wal")).unwrap();
        std::fs::write(empty.join("LOCK"), "").unwrap();
        std::fs::write(empty.join("MANIFEST-00000000000000000001"), "").unwrap();
        fresh.undo().unwrap();
        assert!(empty.is_dir() && std::fs::read_dir(&empty).unwrap().next().is_none());

        std::fs::write(empty.join("notes.txt"), "mine").unwrap();
        let e = Fresh::prepare(&empty, true).err().unwrap();
        assert!(e.to_string().contains("holds files"), "{e}");
        assert!(empty.join("notes.txt").exists());
    }
}
