//! What a backend promises about an acknowledged write: the SPEC §1 `fsync` policy, parsed
//! once when the configuration is read.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// When the log is fsynced (SPEC §1 `fsync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Before every acknowledgement (default): nothing acknowledged is ever lost.
    #[default]
    Always,
    /// Every so often; a batch is acknowledged once written. A machine crash can lose the
    /// last interval; a process crash loses nothing.
    Interval(Duration),
    /// Only on rotation and shutdown.
    Never,
}

/// A `fsync` setting that is none of the three forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fsync must be \"always\", \"never\" or \"interval:<ms>\" with ms > 0, got {got:?}")]
pub struct InvalidFsync {
    pub got: String,
}

impl FromStr for FsyncPolicy {
    type Err = InvalidFsync;
    fn from_str(s: &str) -> Result<Self, InvalidFsync> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            _ => match s.strip_prefix("interval:").map(str::parse::<u64>) {
                Some(Ok(ms)) if ms > 0 => Ok(FsyncPolicy::Interval(Duration::from_millis(ms))),
                _ => Err(InvalidFsync { got: s.to_owned() }),
            },
        }
    }
}

impl fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::Never => f.write_str("never"),
            FsyncPolicy::Interval(d) => write!(f, "interval:{}", d.as_millis()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse() {
        assert_eq!("always".parse(), Ok(FsyncPolicy::Always));
        assert_eq!("never".parse(), Ok(FsyncPolicy::Never));
        assert_eq!(
            "interval:100".parse(),
            Ok(FsyncPolicy::Interval(Duration::from_millis(100)))
        );
        for bad in [
            "",
            "sometimes",
            "interval:",
            "interval:0",
            "interval:-5",
            "interval:1.5",
        ] {
            assert_eq!(
                bad.parse::<FsyncPolicy>(),
                Err(InvalidFsync { got: bad.into() }),
                "{bad}"
            );
        }
        assert_eq!(
            FsyncPolicy::Interval(Duration::from_millis(100)).to_string(),
            "interval:100"
        );
    }
}
