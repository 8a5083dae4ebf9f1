//! The configuration file of SPEC §1 (TOML), validated into [`Settings`] before anything
//! runs: a bad file is one clear error, never a half-applied configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Deserialize;
use tally_core::ingest::{Defaults, Limits};
use tally_core::model::{ModelError, Namespace, Schema, SchemaDoc};
use tally_core::store::{FsyncPolicy, InvalidFsync};

/// Why a configuration was refused, naming the key at fault. Each message is one line;
/// the typed cause is the error's `source`, printed after it in a chain (`{:#}`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not TOML, or not of the documented shape (toml's message, one line, and where).
    #[error("{message}{}", line.map(|l| format!(" (line {l})")).unwrap_or_default())]
    Syntax {
        message: String,
        line: Option<usize>,
    },
    #[error("fsync")]
    Fsync {
        #[source]
        source: InvalidFsync,
    },
    #[error("[namespaces.{name}]")]
    Namespace {
        name: String,
        #[source]
        source: ModelError,
    },
    #[error("[defaults]")]
    Defaults {
        #[source]
        source: ModelError,
    },
    #[error("[limits] {key} must be {rule}")]
    Limit {
        key: &'static str,
        rule: &'static str,
    },
    #[error("[[tokens]] #{number}: the token is empty")]
    EmptyToken { number: usize },
    #[error(
        "[[tokens]] #{number}: a token is printable ASCII with no space at either end (no control characters or non-ASCII letters): no request could match this one"
    )]
    UnsendableToken { number: usize },
    /// Two entries with one secret: which scopes it has would depend on their order.
    #[error("[[tokens]] #{number}: the same token as #{first} (give one entry all its scopes)")]
    RepeatedToken { number: usize, first: usize },
    #[error(
        "[[tokens]] #{number}: no scopes: this token could do nothing; give it read:<ns>, write:<ns> or admin:<ns> (ns may be *), or remove it"
    )]
    NoScopes { number: usize },
    #[error("scope {got:?}: expected read:<ns>, write:<ns> or admin:<ns> (ns may be *)")]
    Scope { got: String },
    #[error("[statsd] {key}: {why}")]
    Statsd { key: &'static str, why: String },
    #[error("[[statsd.map]] #{number}: {field}: {why}")]
    StatsdRule {
        number: usize,
        field: &'static str,
        why: String,
    },
    #[error("scope {got:?}")]
    ScopeNamespace {
        got: String,
        #[source]
        source: ModelError,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    fsync: Option<String>,
    #[serde(default)]
    namespaces: BTreeMap<String, SchemaDoc>,
    defaults: Option<DefaultsDoc>,
    limits: Option<LimitsDoc>,
    #[serde(default)]
    tokens: Vec<TokenDoc>,
    statsd: Option<StatsdDoc>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsdDoc {
    listen: Option<String>,
    listen_tcp: Option<String>,
    namespace: Option<String>,
    key: Option<String>,
    dimensions: Option<Vec<String>>,
    #[serde(default)]
    map: Vec<StatsdMapDoc>,
}

/// `[[statsd.map]]`: a rule; what it omits comes from `[statsd]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatsdMapDoc {
    prefix: String,
    namespace: Option<String>,
    key: Option<String>,
    dimensions: Option<Vec<String>>,
}

/// `[[statsd.map]]` rules at most: each line is matched against them in turn.
pub const MAX_STATSD_RULES: usize = 256;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsDoc {
    tiers: Option<Vec<String>>,
    breakdown_tiers: Option<Vec<String>>,
    dimensions: Option<Vec<String>>,
    auto_create: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsDoc {
    max_body_bytes: Option<usize>,
    max_batch_events: Option<usize>,
    max_batch_updates: Option<usize>,
    max_points: Option<usize>,
    max_answer_bytes: Option<usize>,
    max_future_secs: Option<i64>,
    max_namespaces: Option<usize>,
    query_timeout_ms: Option<u64>,
    header_timeout_ms: Option<u64>,
    body_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    max_connections: Option<usize>,
    max_concurrent_writes: Option<usize>,
    max_concurrent_queries: Option<usize>,
    max_body_bytes_in_flight: Option<usize>,
    max_answer_bytes_in_flight: Option<usize>,
    max_idempotency_keys: Option<usize>,
    max_idempotency_keys_per_token: Option<usize>,
    export_min_bytes_per_sec: Option<usize>,
    dictionary_cache_bytes: Option<usize>,
    scrub_percent: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenDoc {
    token: String,
    scopes: Vec<String>,
}

/// What a scope allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Read,
    Write,
    Admin,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Write => "write",
            Action::Admin => "admin",
        }
    }
}

/// `read:clicks`, `write:*` …; `ns: None` stands for `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    pub action: Action,
    pub ns: Option<Namespace>,
}

impl Scope {
    pub fn parse(s: &str) -> Result<Scope, ConfigError> {
        let bad = || ConfigError::Scope { got: s.to_owned() };
        let (action, ns) = s.split_once(':').ok_or_else(bad)?;
        let action = match action {
            "read" => Action::Read,
            "write" => Action::Write,
            "admin" => Action::Admin,
            _ => return Err(bad()),
        };
        let ns = match ns {
            "*" => None,
            n => Some(
                Namespace::new(n).map_err(|source| ConfigError::ScopeNamespace {
                    got: s.to_owned(),
                    source,
                })?,
            ),
        };
        Ok(Scope { action, ns })
    }

    pub fn allows(&self, action: Action, ns: &str) -> bool {
        self.action == action && self.ns.as_ref().is_none_or(|n| n.as_str() == ns)
    }
}

/// A bearer token and its scopes.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub secret: String,
    pub scopes: Vec<Scope>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.debug_struct("Token")
            .field("scopes", &self.scopes)
            .finish_non_exhaustive()
    }
}

impl Token {
    pub fn allows(&self, action: Action, ns: &str) -> bool {
        self.scopes.iter().any(|s| s.allows(action, ns))
    }
}

/// The `[limits]` the HTTP server applies around the store: how long a client may take,
/// how many may connect, how many requests of each kind run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// A query, or a whole `POST /v1/query`, past it: `503 query_timeout`.
    pub query_timeout_ms: u64,
    /// The request line and headers must arrive within it.
    pub header_timeout_ms: u64,
    /// A whole request body must arrive within it.
    pub body_timeout_ms: u64,
    /// A keep-alive connection with no request for this long is closed.
    pub idle_timeout_ms: u64,
    /// Open connections at once; more are closed at once (logged and counted).
    pub max_connections: usize,
    /// Writes (`POST /v1/events`, `incr`) applied at once; more wait their turn.
    pub max_concurrent_writes: usize,
    /// Queries run at once; more wait their turn. Each holds up to about two answers of
    /// `max_points` points in memory (~25 MB at the defaults), so this also bounds the memory
    /// queries take while they run: ~350 MB measured with 16 `POST /v1/query` bombs at once.
    /// Answers waiting for their clients are `max_answer_bytes_in_flight`'s.
    pub max_concurrent_queries: usize,
    /// Request-body bytes held in memory across all requests at once.
    pub max_body_bytes_in_flight: usize,
    /// Bytes of answers built and not yet taken by their clients, all requests together:
    /// a client that reads nothing holds its answer until `idle_timeout_ms` cuts it off,
    /// so without this bound `max_connections` such clients hold as many answers. An
    /// answer that would pass it is `503`. (Exports stream, bounded by their own rules.)
    pub max_answer_bytes_in_flight: usize,
    /// Idempotency answers the embedded engine remembers at once (each 24 h, in memory and
    /// in every manifest); a request with a new key past it is `503`.
    pub max_idempotency_keys: usize,
    /// Of those, how many one token's keys may hold (with `[[tokens]]` configured), so that
    /// one client cannot fill them all and refuse every other's new key for a day.
    pub max_idempotency_keys_per_token: usize,
    /// An export's client must take its answer at least this fast, measured over the time
    /// the export waited on it beyond a grace of `body_timeout_ms`; slower, it is cut off
    /// (it holds one of the `max_concurrent_queries` export permits meanwhile).
    pub export_min_bytes_per_sec: usize,
    /// Embedded engine: bytes of decoded segment dictionaries (dimension names and values)
    /// held in memory at once, process-wide; past it the least recently read are dropped
    /// and read from their files again when next needed.
    pub dictionary_cache_bytes: usize,
    /// Embedded engine: the share of one core (and of the disk's reads), in percent, that
    /// `tally serve`'s background check of archive segments may take on average; 0 turns it
    /// off.
    pub scrub_percent: u8,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            query_timeout_ms: 10_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            idle_timeout_ms: 60_000,
            max_connections: 4096,
            max_concurrent_writes: 256,
            max_concurrent_queries: 16,
            max_body_bytes_in_flight: 512 * 1024 * 1024,
            max_answer_bytes_in_flight: 512 * 1024 * 1024,
            max_idempotency_keys: 1_000_000,
            max_idempotency_keys_per_token: 100_000,
            export_min_bytes_per_sec: 16 * 1024,
            dictionary_cache_bytes: 256 * 1024 * 1024,
            scrub_percent: 1,
        }
    }
}

/// `[statsd]`: StatsD / DogStatsD counters over UDP and TCP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsdSettings {
    /// Where to listen on UDP; `--statsd` / `TALLY_STATSD` override it. None: no listener.
    pub listen: Option<SocketAddr>,
    /// Where to listen on TCP; `--statsd-tcp` / `TALLY_STATSD_TCP` override it.
    pub listen_tcp: Option<SocketAddr>,
    /// Where each line goes: namespace, key, dimensions.
    pub map: crate::statsd::Mapping,
}

/// The validated configuration.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The fsync policy (`always`, `interval:<ms>`, `never`).
    pub fsync: FsyncPolicy,
    /// Namespaces declared in the file, applied at start.
    pub namespaces: Vec<(Namespace, Schema)>,
    pub defaults: Defaults,
    pub limits: Limits,
    /// The `[limits]` only the HTTP server applies: time, connections, concurrency.
    pub server: ServerLimits,
    /// None configured = no authentication.
    pub tokens: Vec<Token>,
    pub statsd: StatsdSettings,
}

/// Whether a token can reach the server's comparison in an `Authorization: Bearer` header:
/// printable ASCII, spaces inside but none at either end (HTTP drops those), no control
/// characters or non-ASCII bytes (clients refuse to send them). The config's `[[tokens]]`
/// and the CLI's `--token` are held to it.
pub fn sendable_token(t: &str) -> bool {
    !t.is_empty() && t.trim() == t && t.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
}

impl Settings {
    /// Parses and validates the TOML of SPEC §1.
    pub fn from_toml(text: &str) -> Result<Settings, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            message: e.message().to_owned(),
            line: e.span().map(|r| {
                text.as_bytes()[..r.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            }),
        })?;
        let mut s = Settings::default();
        if let Some(f) = file.fsync {
            s.fsync = f.parse().map_err(|source| ConfigError::Fsync { source })?;
        }
        for (name, doc) in &file.namespaces {
            let at = |source| ConfigError::Namespace {
                name: name.clone(),
                source,
            };
            let ns = Namespace::new(name).map_err(at)?;
            let schema = Schema::from_input(doc).map_err(at)?;
            s.namespaces.push((ns, schema));
        }
        if let Some(d) = file.defaults {
            if d.tiers.is_some() || d.breakdown_tiers.is_some() || d.dimensions.is_some() {
                let doc = SchemaDoc {
                    tiers: d.tiers.unwrap_or_else(|| s.defaults.schema.to_doc().tiers),
                    breakdown_tiers: d.breakdown_tiers,
                    dimensions: d.dimensions,
                };
                s.defaults.schema =
                    Schema::from_input(&doc).map_err(|source| ConfigError::Defaults { source })?;
            }
            if let Some(a) = d.auto_create {
                s.defaults.auto_create = a;
            }
        }
        if let Some(l) = file.limits {
            let positive = |key: &'static str, v: Option<usize>, default: usize| match v {
                Some(0) => Err(ConfigError::Limit {
                    key,
                    rule: "greater than 0",
                }),
                Some(v) => Ok(v),
                None => Ok(default),
            };
            s.limits.max_body_bytes =
                positive("max_body_bytes", l.max_body_bytes, s.limits.max_body_bytes)?;
            s.limits.max_batch_events = positive(
                "max_batch_events",
                l.max_batch_events,
                s.limits.max_batch_events,
            )?;
            s.limits.max_batch_updates = positive(
                "max_batch_updates",
                l.max_batch_updates,
                s.limits.max_batch_updates,
            )?;
            s.limits.max_points = positive("max_points", l.max_points, s.limits.max_points)?;
            s.limits.max_answer_bytes = positive(
                "max_answer_bytes",
                l.max_answer_bytes,
                s.limits.max_answer_bytes,
            )?;
            s.limits.max_namespaces =
                positive("max_namespaces", l.max_namespaces, s.limits.max_namespaces)?;
            if let Some(f) = l.max_future_secs {
                if f < 0 {
                    return Err(ConfigError::Limit {
                        key: "max_future_secs",
                        rule: "0 or more",
                    });
                }
                s.limits.max_future_secs = f;
            }
            // Counts of things held at once become semaphores (tokio's hold at most
            // `usize::MAX >> 3` permits) and timeouts become deadlines: bounded far past any
            // use, so a typo is a clear error rather than a panic at start.
            let at_most =
                |key: &'static str, v: Option<usize>, default: usize, max, rule| match positive(
                    key, v, default,
                )? {
                    v if v > max => Err(ConfigError::Limit { key, rule }),
                    v => Ok(v),
                };
            let count = |key: &'static str, v: Option<usize>, default: usize| {
                at_most(key, v, default, 1_000_000, "from 1 to 1000000")
            };
            let ms = |key: &'static str, v: Option<u64>, default: u64| {
                let v = v.map(|v| usize::try_from(v).unwrap_or(usize::MAX));
                at_most(
                    key,
                    v,
                    default as usize,
                    86_400_000,
                    "from 1 to 86400000 (a day)",
                )
                .map(|v| v as u64)
            };
            let d = ServerLimits::default();
            s.server = ServerLimits {
                query_timeout_ms: ms("query_timeout_ms", l.query_timeout_ms, d.query_timeout_ms)?,
                header_timeout_ms: ms(
                    "header_timeout_ms",
                    l.header_timeout_ms,
                    d.header_timeout_ms,
                )?,
                body_timeout_ms: ms("body_timeout_ms", l.body_timeout_ms, d.body_timeout_ms)?,
                idle_timeout_ms: ms("idle_timeout_ms", l.idle_timeout_ms, d.idle_timeout_ms)?,
                max_connections: count("max_connections", l.max_connections, d.max_connections)?,
                max_concurrent_writes: count(
                    "max_concurrent_writes",
                    l.max_concurrent_writes,
                    d.max_concurrent_writes,
                )?,
                max_concurrent_queries: count(
                    "max_concurrent_queries",
                    l.max_concurrent_queries,
                    d.max_concurrent_queries,
                )?,
                max_body_bytes_in_flight: positive(
                    "max_body_bytes_in_flight",
                    l.max_body_bytes_in_flight,
                    d.max_body_bytes_in_flight,
                )?,
                max_answer_bytes_in_flight: positive(
                    "max_answer_bytes_in_flight",
                    l.max_answer_bytes_in_flight,
                    d.max_answer_bytes_in_flight,
                )?,
                max_idempotency_keys: positive(
                    "max_idempotency_keys",
                    l.max_idempotency_keys,
                    d.max_idempotency_keys,
                )?,
                max_idempotency_keys_per_token: positive(
                    "max_idempotency_keys_per_token",
                    l.max_idempotency_keys_per_token,
                    d.max_idempotency_keys_per_token,
                )?,
                export_min_bytes_per_sec: at_most(
                    "export_min_bytes_per_sec",
                    l.export_min_bytes_per_sec,
                    d.export_min_bytes_per_sec,
                    1 << 30,
                    "from 1 to 1073741824 (1 GiB/s)",
                )?,
                dictionary_cache_bytes: positive(
                    "dictionary_cache_bytes",
                    l.dictionary_cache_bytes,
                    d.dictionary_cache_bytes,
                )?,
                scrub_percent: match l.scrub_percent {
                    None => d.scrub_percent,
                    Some(p @ 0..=100) => p as u8,
                    Some(_) => {
                        return Err(ConfigError::Limit {
                            key: "scrub_percent",
                            rule: "from 0 (off) to 100",
                        });
                    }
                },
            };
        }
        // A body larger than the budget of all bodies in flight could never be taken: every
        // one would be `503 … try again shortly`, forever.
        if s.server.max_body_bytes_in_flight < s.limits.max_body_bytes {
            return Err(ConfigError::Limit {
                key: "max_body_bytes_in_flight",
                rule: "at least max_body_bytes (one body of that size must fit)",
            });
        }
        for (i, t) in file.tokens.iter().enumerate() {
            if t.token.is_empty() {
                return Err(ConfigError::EmptyToken { number: i + 1 });
            }
            if !sendable_token(&t.token) {
                return Err(ConfigError::UnsendableToken { number: i + 1 });
            }
            if let Some(first) = s.tokens.iter().position(|seen| seen.secret == t.token) {
                return Err(ConfigError::RepeatedToken {
                    number: i + 1,
                    first: first + 1,
                });
            }
            if t.scopes.is_empty() {
                return Err(ConfigError::NoScopes { number: i + 1 });
            }
            let scopes = t
                .scopes
                .iter()
                .map(|s| Scope::parse(s))
                .collect::<Result<Vec<_>, _>>()?;
            s.tokens.push(Token {
                secret: t.token.clone(),
                scopes,
            });
        }
        if let Some(d) = file.statsd {
            s.statsd = statsd_settings(d)?;
        }
        Ok(s)
    }
}

/// Checks `[statsd]` and its rules.
fn statsd_settings(d: StatsdDoc) -> Result<StatsdSettings, ConfigError> {
    use crate::statsd::map::{Mapping, Rule};
    let addr = |key: &'static str, l: String| {
        l.parse().map_err(|_| ConfigError::Statsd {
            key,
            why: format!("{l:?} is not an ADDR:PORT (e.g. \"127.0.0.1:8125\")"),
        })
    };
    let listen = d.listen.map(|l| addr("listen", l)).transpose()?;
    let listen_tcp = d.listen_tcp.map(|l| addr("listen_tcp", l)).transpose()?;
    let namespace = d
        .namespace
        .unwrap_or_else(|| crate::statsd::DEFAULT_NAMESPACE.to_owned());
    let key = d.key.unwrap_or_else(|| "{name}".to_owned());
    let fallback = Rule::new("", &namespace, &key, d.dimensions.clone())
        .map_err(|(key, why)| ConfigError::Statsd { key, why })?;
    if d.map.len() > MAX_STATSD_RULES {
        return Err(ConfigError::Statsd {
            key: "map",
            why: format!("at most {MAX_STATSD_RULES} rules, got {}", d.map.len()),
        });
    }
    let mut rules = Vec::with_capacity(d.map.len());
    for (i, r) in d.map.into_iter().enumerate() {
        let rule = Rule::new(
            &r.prefix,
            r.namespace.as_deref().unwrap_or(&namespace),
            r.key.as_deref().unwrap_or(&key),
            r.dimensions.or_else(|| d.dimensions.clone()),
        )
        .map_err(|(field, why)| ConfigError::StatsdRule {
            number: i + 1,
            field,
            why,
        })?;
        rules.push(rule);
    }
    Ok(StatsdSettings {
        listen,
        listen_tcp,
        map: Mapping::new(fallback, rules),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error and its causes, as `anyhow`'s `{:#}` prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            out = format!("{out}: {c}");
            cause = c.source();
        }
        out
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = Settings::from_toml("fsync = \"always\"\n\nlimits = 3").unwrap_err();
        assert!(
            matches!(e, ConfigError::Syntax { line: Some(3), .. }),
            "{e:?}"
        );
    }

    #[test]
    fn the_spec_example_parses() {
        let s = Settings::from_toml(
            r#"
fsync = "always"

[namespaces.api_hits]
tiers = ["1s:2h", "1m:48h", "1h:forever"]
breakdown_tiers = ["1m", "1h"]
dimensions = ["status", "outcome", "status+outcome"]

[defaults]
tiers = ["1m:48h", "1h:forever"]
auto_create = true

[limits]
max_body_bytes = 16777216
max_batch_events = 100000
max_batch_updates = 4000000
max_points = 100000
max_answer_bytes = 67108864
max_future_secs = 3600
max_namespaces = 10000
query_timeout_ms = 10000
header_timeout_ms = 10000
body_timeout_ms = 30000
idle_timeout_ms = 60000
max_connections = 4096
max_concurrent_writes = 256
max_concurrent_queries = 16
max_body_bytes_in_flight = 536870912
max_answer_bytes_in_flight = 536870912
max_idempotency_keys = 1000000
max_idempotency_keys_per_token = 100000
export_min_bytes_per_sec = 16384
dictionary_cache_bytes = 268435456
scrub_percent = 1

[[tokens]]
token = "s3cret"
scopes = ["write:clicks", "read:*"]

[[tokens]]
token = "spaces inside are fine"
scopes = ["read:*"]

[statsd]
listen = "127.0.0.1:8125"
listen_tcp = "127.0.0.1:8125"
namespace = "statsd"
key = "{name}"

[[statsd.map]]
prefix = "api."
namespace = "api"
key = "{rest}.{tag:org}"
dimensions = ["status"]
"#,
        )
        .unwrap();
        assert_eq!(s.namespaces.len(), 1);
        assert_eq!(
            s.statsd.listen,
            Some(SocketAddr::from(([127, 0, 0, 1], 8125)))
        );
        assert_eq!(s.statsd.listen_tcp, s.statsd.listen);
        assert_eq!(s.statsd.map.fallback().namespace, "statsd");
        assert_eq!(s.statsd.map.rule("api.hits").namespace, "api");
        assert_eq!(s.server, ServerLimits::default());
        assert_eq!(s.limits, Limits::default());
        assert_eq!(s.tokens.len(), 2, "a token may hold spaces inside");
        assert!(s.tokens[0].allows(Action::Read, "anything"));
        assert!(s.tokens[0].allows(Action::Write, "clicks"));
        assert!(!s.tokens[0].allows(Action::Write, "other"));
        assert!(!s.tokens[0].allows(Action::Admin, "clicks"));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, needle) in [
            ("fsync = 3", "invalid type"),
            ("fsync = \"sometimes\"", "fsync: fsync must be"),
            (
                "[limits]\nmax_future_secs = -1",
                "max_future_secs must be 0 or more",
            ),
            (
                "[limits]\nmax_namespaces = 0",
                "max_namespaces must be greater than 0",
            ),
            (
                "[[tokens]]\ntoken = \"\"\nscopes = [\"read:*\"]",
                "#1: the token is empty",
            ),
            (
                "[[tokens]]\ntoken = \"ends with a space \"\nscopes = [\"read:*\"]",
                "#1: a token is printable ASCII",
            ),
            (
                "[[tokens]]\ntoken = \"t\"\nscopes = [\"read:*\"]\n[[tokens]]\ntoken = \"tökén\"\nscopes = [\"read:*\"]",
                "#2: a token is printable ASCII",
            ),
            (
                "[[tokens]]\ntoken = \"tab\\there\"\nscopes = [\"read:*\"]",
                "#1: a token is printable ASCII",
            ),
            (
                "[[tokens]]\ntoken = \"t\"\nscopes = [\"read:*\"]\n[[tokens]]\ntoken = \"u\"\nscopes = [\"read:*\"]\n[[tokens]]\ntoken = \"t\"\nscopes = [\"admin:*\"]",
                "#3: the same token as #1",
            ),
            (
                "[[tokens]]\ntoken = \"t\"\nscopes = [\"read:Bad\"]",
                "invalid namespace name",
            ),
            (
                "[[tokens]]\ntoken = \"t\"\nscopes = [\"read:*\"]\n[[tokens]]\ntoken = \"u\"\nscopes = []",
                "#2: no scopes: this token could do nothing",
            ),
            ("unknown = 1", "unknown field"),
            (
                "[namespaces.Bad]\ntiers = [\"1h:forever\"]",
                "namespaces.Bad",
            ),
            ("[namespaces.x]\ntiers = [\"7m:1h\"]", "does not divide 1h"),
            ("[limits]\nmax_points = 0", "max_points"),
            ("[limits]\nquery_timeout_ms = 0", "query_timeout_ms"),
            ("[limits]\nmax_connections = 0", "max_connections"),
            ("[limits]\nmax_idempotency_keys = 0", "max_idempotency_keys"),
            (
                "[limits]\nmax_answer_bytes_in_flight = 0",
                "max_answer_bytes_in_flight must be greater than 0",
            ),
            (
                "[namespaces.x]\ntiers = [\"1h:forever\"]\ndimensions = [\"a+b0\", \"a+b1\", \
                 \"a+b2\", \"a+b3\", \"a+b4\", \"a+b5\", \"a+b6\", \"a+b7\", \"a+b8\", \"a+b9\", \
                 \"a+c0\", \"a+c1\", \"a+c2\", \"a+c3\", \"a+c4\", \"a+c5\", \"a+c6\"]",
                "at most 16 compound dimensions",
            ),
            // Past what a semaphore or a deadline takes: refused, not a panic at start.
            (
                "[limits]\nmax_connections = 4000000000000000000",
                "max_connections must be from 1 to 1000000",
            ),
            (
                "[limits]\nmax_concurrent_writes = 4000000000000000000",
                "max_concurrent_writes must be from 1 to 1000000",
            ),
            (
                "[limits]\nmax_concurrent_queries = 1000001",
                "max_concurrent_queries must be from 1 to 1000000",
            ),
            (
                "[limits]\nidle_timeout_ms = 18446744073709551615",
                "idle_timeout_ms must be from 1 to 86400000",
            ),
            (
                "[limits]\nexport_min_bytes_per_sec = 0",
                "export_min_bytes_per_sec must be greater than 0",
            ),
            (
                "[limits]\nexport_min_bytes_per_sec = 1073741825",
                "export_min_bytes_per_sec must be from 1 to 1073741824",
            ),
            (
                "[limits]\ndictionary_cache_bytes = 0",
                "dictionary_cache_bytes must be greater than 0",
            ),
            (
                "[limits]\nmax_body_bytes = 100000\nmax_body_bytes_in_flight = 100",
                "max_body_bytes_in_flight must be at least max_body_bytes",
            ),
            (
                "[limits]\nscrub_percent = 101",
                "scrub_percent must be from 0 (off) to 100",
            ),
            (
                "[limits]\nscrub_percent = -1",
                "invalid value: integer `-1`",
            ),
            ("[[tokens]]\ntoken = \"t\"\nscopes = [\"peek:*\"]", "scope"),
            ("[defaults]\ntiers = []", "[defaults]"),
            (
                "[statsd]\nlisten = \"8125\"",
                "[statsd] listen: \"8125\" is not",
            ),
            (
                "[statsd]\nnamespace = \"Bad NS\"",
                "[statsd] namespace: invalid",
            ),
            ("[statsd]\nport = 8125", "unknown field"),
            (
                "[statsd]\nlisten_tcp = \"localhost\"",
                "[statsd] listen_tcp: \"localhost\" is not",
            ),
            (
                "[statsd]\nkey = \"{nam}\"",
                "[statsd] key: \"{nam}\": unknown",
            ),
            (
                "[statsd]\ndimensions = [\"Bad\"]",
                "[statsd] dimensions: invalid dimension",
            ),
            (
                "[[statsd.map]]\nprefix = \"a.\"\nnamespace = \"B\"",
                "[[statsd.map]] #1: namespace: invalid",
            ),
            (
                "[[statsd.map]]\nprefix = \"a.\"\n[[statsd.map]]\nprefix = \"b.\"\nkey = \"{\"",
                "[[statsd.map]] #2: key:",
            ),
            (
                "[[statsd.map]]\nnamespace = \"a\"",
                "missing field `prefix`",
            ),
        ] {
            let e = chain(&Settings::from_toml(text).unwrap_err());
            assert!(e.contains(needle), "{text:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
