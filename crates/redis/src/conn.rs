//! Connections: a single server through the connection manager (one multiplexed
//! connection, reconnected with backoff), or a cluster through the cluster-async client
//! (which follows MOVED/ASK and refreshes its slot map). Both sit behind [`Conn`], and every
//! Redis error becomes a [`StoreError`] naming the server.

use std::time::Duration;

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};
use tally_core::store::StoreError;

/// Where the store's Redis is, parsed from `--backend`.
#[derive(Clone, PartialEq, Eq)]
pub enum Target {
    /// `redis://host:port/db`
    Single(String),
    /// `redis+cluster://host:port,host:port,…`: the seed nodes, as `redis://host:port`.
    Cluster(Vec<String>),
}

impl Target {
    pub fn parse(url: &str) -> Result<Target, StoreError> {
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let nodes: Vec<String> = rest
                .trim_end_matches('/')
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(|n| format!("redis://{n}"))
                .collect();
            if nodes.is_empty() {
                return Err(StoreError::unavailable(format!(
                    "backend {:?} names no cluster node (redis+cluster://host:port,host:port,…)",
                    redact(url)
                )));
            }
            Ok(Target::Cluster(nodes))
        } else if url.starts_with("redis://") {
            Ok(Target::Single(url.to_owned()))
        } else {
            Err(StoreError::unavailable(format!(
                "backend {:?} is neither redis://host:port/db nor redis+cluster://host:port,…",
                redact(url)
            )))
        }
    }

    /// How messages name it: `redis at 127.0.0.1:6379`, `redis cluster at a:1,b:2`; a
    /// password in the URL is left out ([`redact`]).
    pub fn describe(&self) -> String {
        match self {
            Target::Single(url) => {
                format!("redis at {}", redact(url.trim_start_matches("redis://")))
            }
            Target::Cluster(nodes) => {
                // Redacted as one list: a password's unescaped `,` split it into nodes.
                let nodes: Vec<&str> = nodes
                    .iter()
                    .map(|n| n.trim_start_matches("redis://"))
                    .collect();
                let shown = redact(&format!("redis+cluster://{}", nodes.join(",")));
                format!(
                    "redis cluster at {}",
                    shown.trim_start_matches("redis+cluster://")
                )
            }
        }
    }
}

/// Shown as [`Target::describe`] says, without a password.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

/// `url` (a backend URL, or one node of it) with every password in it replaced by `***`,
/// user names kept: `redis://app:***@host:6379/0`. Messages, error answers and logs name
/// the backend this way (found by a black-box review: the password was in every `503`).
/// Malformed URLs too: a password with an unescaped `/`, `#`, `?` or `,` must not show,
/// so a node's user information runs to its *last* `@` whatever comes before it; a query
/// (`?pass=…` of a unix socket URL) is hidden whole; a node with a `?` before its last `@`
/// (a `?` in the password, or an `@` in the query) is hidden whole. Only `redis+cluster://`
/// lists several nodes, split at `,` (where a `,` in a password is `%2C`).
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let one = |node: &str| {
        let hide_query = |s: &str| match s.find('?') {
            Some(q) => format!("{}?***", &s[..q]),
            None => s.to_owned(),
        };
        match (node.find('?'), node.rfind('@')) {
            (Some(q), Some(at)) if q < at => "***".to_owned(),
            (_, Some(at)) if node[..at].contains(':') => {
                let user = node[..at].split(':').next().unwrap_or_default();
                format!("{user}:***@{}", hide_query(&node[at + 1..]))
            }
            _ => hide_query(node),
        }
    };
    let shown = if scheme == "redis+cluster://" && rest.contains('@') {
        // A piece without `@` may be a node given without credentials (`host:port`) or
        // the part of an unescaped password before its `,` (`user:pa`): shown only when
        // it reads as a host and a numeric port.
        let host_port = |p: &str| {
            p.rsplit_once(':').is_some_and(|(h, port)| {
                !h.is_empty() && !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())
            })
        };
        rest.split(',')
            .map(|p| match p.rfind('@') {
                Some(at) if p[..at].contains(':') => one(p),
                // (`pw@host`: maybe the tail of a password cut at its `,`.)
                Some(at) => format!("***@{}", one(&p[at + 1..])),
                None if host_port(p) => p.to_owned(),
                None => "***".to_owned(),
            })
            .collect::<Vec<_>>()
            .join(",")
    } else if scheme == "redis+cluster://" {
        rest.split(',').map(one).collect::<Vec<_>>().join(",")
    } else {
        one(rest)
    };
    format!("{scheme}{shown}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_a_message() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/0", "redis at 127.0.0.1:6379/0"),
            (
                "redis://tl:pw@127.0.0.1:6379/0",
                "redis at tl:***@127.0.0.1:6379/0",
            ),
            ("redis://:pw@h:1", "redis at :***@h:1"),
            ("redis://user@h:1", "redis at user@h:1"),
            ("redis://u:p@ss@h:1/2", "redis at u:***@h:1/2"),
            ("redis://u:p,w@h:1", "redis at u:***@h:1"),
            ("redis://u:p%2Cw@h:1/0?x=1", "redis at u:***@h:1/0?***"),
            (
                "redis+cluster://a:x@h1:1,h2:2,b:y@h3:3",
                "redis cluster at a:***@h1:1,h2:2,b:***@h3:3",
            ),
        ] {
            assert_eq!(Target::parse(url).unwrap().describe(), shown, "{url}");
        }
        let t = Target::parse("redis+cluster://comma:pa,ss@127.0.0.1:26391").unwrap();
        assert!(
            !t.describe().contains("pa") && !t.describe().contains("ss@"),
            "{t:?}"
        );
        let e = Target::parse("rediss://u:secret@h:1").unwrap_err();
        assert!(!e.detail().contains("secret"), "{}", e.detail());
        let e = Target::parse("redis+cluster://").unwrap_err();
        assert!(
            e.detail().contains("names no cluster node"),
            "{}",
            e.detail()
        );
        assert_eq!(
            redact("redis+cluster://u:pw@a:1"),
            "redis+cluster://u:***@a:1"
        );
        assert_eq!(redact("rediss://u:s,e@cret@h:1"), "rediss://u:***@h:1");
        assert_eq!(
            redact("unix:///run/redis.sock?db=0&pass=secret"),
            "unix:///run/redis.sock?***"
        );
        // Malformed: unescaped characters in a password (found by a black-box check).
        for (url, secret) in [
            ("redis://user:s3c/ret@127.0.0.1:1/0", "ret"),
            ("redis://user:s3c#ret@127.0.0.1:1/0", "ret"),
            ("redis://user:s3c?ret@127.0.0.1:1/0", "s3c"),
            ("redis://:s3c/ret@h:1", "ret"),
            ("redis+cluster://comma:pa,ss@127.0.0.1:26391", "pa"),
            ("redis+cluster://comma:wrong,pw@h:1,h:2", "wrong"),
            ("redis+cluster://comma:wrong,pw@h:1,h:2", "pw"),
            ("unix:///x.sock?pass=a@b", "a@b"),
        ] {
            let shown = redact(url);
            assert!(!shown.contains(secret), "{url}: {shown}");
            assert!(!shown.contains("s3c"), "{url}: {shown}");
        }
        assert_eq!(
            redact("redis://user:s3c/ret@127.0.0.1:1/0"),
            "redis://user:***@127.0.0.1:1/0"
        );
    }
}

/// Timeouts: a connection attempt, and one reply (a script over a large batch included).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// One connection (cheap to clone: clones share it).
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
        })
    }
}

impl Conn {
    pub async fn open(target: &Target) -> Result<Conn, RedisError> {
        match target {
            Target::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                // Backoff between reconnection attempts: 50 ms doubling to 2 s, a few
                // attempts per failure; the next request after that starts a new round.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_secs(2))
                    .set_number_of_retries(3);
                Ok(Conn::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            Target::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes.clone())
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .retries(3)
                    .min_retry_wait(20)
                    .max_retry_wait(500)
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// The masters of a cluster as `(host, port)`, from `CLUSTER SLOTS` (which lists a
    /// failed master's slots too); empty for a single server.
    async fn masters(&self) -> Result<Vec<(String, u16)>, RedisError> {
        let Conn::Cluster(c) = self else {
            return Ok(Vec::new());
        };
        let mut c = c.clone();
        let slots: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut c)
            .await?;
        let mut out = Vec::new();
        if let Value::Array(ranges) = slots {
            for r in ranges {
                if let Value::Array(parts) = r
                    && let Some(Value::Array(master)) = parts.get(2)
                    && let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1))
                {
                    let host = match host {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        Value::SimpleString(s) => s.clone(),
                        _ => continue,
                    };
                    let port = u16::try_from(*port).unwrap_or(0);
                    if !out.contains(&(host.clone(), port)) {
                        out.push((host, port));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Sends `cmd` to the server, or to every master of a cluster, one by one by address
    /// (the client's own fan-out skips a master it lost): the answers, or the first
    /// failure, naming its node.
    pub async fn on_every_master(self, cmd: Cmd) -> Result<Vec<Value>, RedisError> {
        let masters = self.masters().await?;
        match self {
            Conn::Single(mut c) => Ok(vec![cmd.query_async(&mut c).await?]),
            Conn::Cluster(c) => {
                let answers = join_all(masters.into_iter().map(|(host, port)| {
                    let (mut c, cmd) = (c.clone(), cmd.clone());
                    async move {
                        let at = format!("{host}:{port}");
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host,
                            port,
                        });
                        c.route_command(cmd, routing).await.map_err(|e| {
                            let detail = format!("{at}: {e}");
                            RedisError::from((e.kind(), "node", detail))
                        })
                    }
                }))
                .await;
                answers.into_iter().collect()
            }
        }
    }
}

impl Conn {
    /// The nodes to `SCAN` for every key: the server, or each master of a cluster.
    pub async fn scan_nodes(&self) -> Result<Vec<Option<(String, u16)>>, RedisError> {
        match self {
            Conn::Single(_) => Ok(vec![None]),
            Conn::Cluster(_) => Ok(self.masters().await?.into_iter().map(Some).collect()),
        }
    }

    /// One `SCAN <cursor> MATCH <pattern> COUNT <count>` on a node of
    /// [`Conn::scan_nodes`]: the next cursor (0 at the end) and the names.
    pub async fn scan_page(
        self,
        node: Option<(String, u16)>,
        cursor: u64,
        pattern: &str,
        count: usize,
    ) -> Result<(u64, Vec<String>), RedisError> {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(count);
        match (self, node) {
            (Conn::Single(mut c), _) => cmd.query_async(&mut c).await,
            (Conn::Cluster(mut c), Some((host, port))) => {
                let routing =
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
                let v = c.route_command(cmd, routing).await?;
                redis::from_redis_value(v).map_err(|e| {
                    RedisError::from((ErrorKind::Parse, "a SCAN answer", e.to_string()))
                })
            }
            (Conn::Cluster(_), None) => Err(RedisError::from((
                ErrorKind::Client,
                "a cluster SCAN needs a node",
            ))),
        }
    }

    /// Sends `cmd` to the master serving `key` (the server itself, on a single server).
    pub async fn on_node_of(self, key: &str, cmd: Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(mut c) => cmd.query_async(&mut c).await,
            Conn::Cluster(mut c) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.route_command(cmd, routing).await
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Whether a failed call may be sent again as is: the connection broke, timed out, or the
/// cluster is between states. (A script call carries its batch's marker, so sending it
/// again never applies it twice.)
pub fn transient(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                )
        )
}

/// A Redis failure as the store reports it: `Unavailable` ("redis at host:port: …") for
/// anything about reaching or being served by Redis, `Internal` for a reply tally did not
/// expect (a script error, a wrong type: someone else's key, or a bug).
pub fn store_error(target: &str, e: RedisError) -> StoreError {
    // Past `maxmemory` (the policy is `noeviction`, checked at connect) Redis refuses
    // writes, inside a script too (then the error is the script's): unavailable until
    // memory is freed, not a bug.
    // (A pipeline's error names its failed command's code only in its text.)
    let text = e.to_string();
    if e.code() == Some("OOM")
        || text.contains("OOM command not allowed")
        || text.contains("\"OOM\": ")
    {
        return StoreError::unavailable(format!(
            "{target} is out of memory (maxmemory) and refuses writes: free memory or \
             raise maxmemory, then retry"
        ))
        .because(e);
    }
    // A script running past Redis' `busy-reply-threshold` (5 s by default: another
    // client's, or another tally server's very large batch) makes Redis refuse every other
    // command until it ends: nothing was run, so it is unavailable for a moment, not a bug.
    if e.code() == Some("BUSY") || text.contains("\"BUSY\": ") {
        return StoreError::unavailable(format!(
            "{target} is busy running a script and refuses other commands until it ends; \
             retry"
        ));
    }
    // A command or key the user's ACL refuses (changed under a running store: connect
    // checks `INFO`), directly or inside a script, where Redis does not name the command:
    // the operator's to grant, not a bug.
    if e.code() == Some("NOPERM") || text.contains("The user executing the script can't") {
        return StoreError::unavailable(format!(
            "{target} refuses this Redis user a command or key that tally needs (ACL: \
             {e}); grant every command on tally's keys (INFO included), then retry"
        ));
    }
    let unexpected = matches!(
        e.kind(),
        ErrorKind::UnexpectedReturnType | ErrorKind::Parse | ErrorKind::Extension
    ) || matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::ResponseError | ServerErrorKind::ExecAbort)
    ) && !text.contains("OOM");
    if unexpected && !transient(&e) {
        return StoreError::internal(format!("{target} answered unexpectedly: {e}"));
    }
    // A refusal or a time out says all there is in a few words: the client's own error
    // would only repeat them ("timed out: timed out: timed out", found by a review).
    if e.is_connection_refusal() {
        return StoreError::unavailable(format!("{target}: connection refused"));
    }
    if e.is_timeout() {
        return StoreError::unavailable(format!("{target}: timed out"));
    }
    StoreError::unavailable(format!("{target}: {e}")).because(e)
}
