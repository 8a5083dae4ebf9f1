//! The schema records (`tally:schemas`, docs/redis.md "Schema records and generations"):
//! reads, with the records last read standing in while their node is down; compare-and-set
//! changes; dimension codes given pending and confirmed once the node's replicas have them;
//! rewrites of records an older layout wrote.

use std::collections::BTreeMap;
use std::sync::PoisonError;
use std::time::Duration;

use tally_core::model::{Namespace, Schema};
use tally_core::store::StoreError;

use crate::layout::{LAYOUT_VERSION, SCHEMAS_KEY, SchemaRecord, Stored};
use crate::{RedisStore, collect_text, layout, scripts};

/// How long a write of new dimension codes waits for the schemas node's replicas.
const REPLICA_WAIT: Duration = Duration::from_millis(200);
/// After the replicas did not acknowledge new codes in time, writes of that namespace spell
/// their subtotals out for this long before they wait for the replicas again.
const CONFIRM_BACKOFF: Duration = Duration::from_secs(1);

impl RedisStore {
    /// The stored schemas of `nss` (those that exist).
    pub(crate) async fn load_schemas(
        &self,
        nss: &[&Namespace],
    ) -> Result<BTreeMap<Namespace, Stored>, StoreError> {
        if nss.is_empty() {
            return Ok(BTreeMap::new());
        }
        let names: Vec<&str> = nss.iter().map(|n| n.as_str()).collect();
        let got: Result<Vec<Option<Vec<u8>>>, StoreError> = self
            .retry(|mut c| {
                let names = &names;
                async move {
                    redis::cmd("HMGET")
                        .arg(SCHEMAS_KEY)
                        .arg(names)
                        .query_async(&mut c)
                        .await
                }
            })
            .await;
        let got = match got {
            Ok(g) => g,
            Err(e @ StoreError::Unavailable { .. }) => {
                // The node holding the schemas is out of reach: the last schemas read serve
                // the series on other nodes; a namespace never read fails as before.
                let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
                if nss.iter().all(|n| known.contains_key(*n)) {
                    tracing::warn!(error = %e.detail(), "using the schemas last read");
                    return Ok(nss
                        .iter()
                        .filter_map(|n| {
                            let mut s = known.get(*n)?.clone();
                            s.cached = true;
                            Some(((*n).clone(), s))
                        })
                        .collect());
                }
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let mut out = BTreeMap::new();
        for (ns, text) in nss.iter().zip(got) {
            if let Some(text) = text {
                out.insert((*ns).clone(), SchemaRecord::decode(ns.as_str(), &text)?);
            }
        }
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        for (ns, s) in &out {
            known.insert(ns.clone(), s.clone());
        }
        Ok(out)
    }

    /// Every namespace's stored record, by namespace.
    pub(crate) async fn all_records(&self) -> Result<Vec<(Namespace, Stored)>, StoreError> {
        let all: Vec<(String, Vec<u8>)> = self
            .retry(|mut c| async move {
                redis::cmd("HGETALL")
                    .arg(SCHEMAS_KEY)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let mut out = Vec::with_capacity(all.len());
        for (name, text) in all {
            let ns = Namespace::new(&name).map_err(|e| {
                StoreError::corrupt(format!("{SCHEMAS_KEY} holds an invalid namespace name"))
                    .because(e)
            })?;
            let stored = SchemaRecord::decode(&name, &text)?;
            out.push((ns, stored));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    pub(crate) async fn all_schemas(&self) -> Result<Vec<(Namespace, Schema)>, StoreError> {
        let all = self.all_records().await?;
        let now = self.clock.now();
        Ok(all
            .into_iter()
            .map(|(ns, s)| (ns, s.schema_at(now)))
            .collect())
    }

    /// Stores the schema; if a tier's retention grew, extends its expiries before answering
    /// (`retention`).
    pub(crate) async fn put_schema_async(
        &self,
        ns: &Namespace,
        schema: &Schema,
    ) -> Result<(), StoreError> {
        self.vet().await?;
        let stored = self
            .update_record(ns, |previous| {
                // Read for each attempt, just before its compare-and-set.
                let now = self.clock.now();
                let before =
                    previous.and_then(|p| SchemaRecord::decode_schema(ns.as_str(), p).ok());
                let schema = schema
                    .clone()
                    .replacing(before.as_ref(), now, self.max_future_secs);
                // A growth still to be extended is held to its old retention by reads
                // (`Stored::schema_at`), and by `hold_growth` once it is done.
                Some(SchemaRecord::next(previous, &schema))
            })
            .await?;
        if stored.is_some_and(|s| !s.record.extend.is_empty()) {
            self.extend_expiries(ns, true).await.map_err(|e| {
                StoreError::unavailable(format!(
                    "{}: the schema of {ns} is stored, but extending the expiries of its \
                     tiers whose retention grew failed ({}); send it again to finish, before \
                     their data expires under the shorter retention",
                    self.label,
                    e.detail()
                ))
            })?;
        }
        Ok(())
    }

    /// A namespace's schema record as stored now: its text (empty if none) and decoded.
    pub(crate) async fn read_record(
        &self,
        ns: &Namespace,
    ) -> Result<(Vec<u8>, Option<Stored>), StoreError> {
        let current: Option<Vec<u8>> = self
            .retry(|mut c| async move {
                redis::cmd("HGET")
                    .arg(SCHEMAS_KEY)
                    .arg(ns.as_str())
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let decoded = match &current {
            Some(text) => Some(SchemaRecord::decode(ns.as_str(), text)?),
            None => None,
        };
        Ok((current.unwrap_or_default(), decoded))
    }

    /// Replaces a namespace's record `current` (its text, empty for none) by `text` if it is
    /// still `current` (the `PUT_SCHEMA` compare-and-set): whether it was replaced, and
    /// remembers it if so.
    pub(crate) async fn swap_record(
        &self,
        ns: &Namespace,
        current: &[u8],
        text: &str,
    ) -> Result<Option<Stored>, StoreError> {
        let done: i64 = self
            .retry(|mut c| async move {
                scripts::PUT_SCHEMA
                    .key(SCHEMAS_KEY)
                    .arg(ns.as_str())
                    .arg(current)
                    .arg(text)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        if done != 1 {
            return Ok(None);
        }
        self.remember(ns, text).map(Some)
    }

    /// Decodes a record just stored and keeps it as the one last read of `ns`.
    fn remember(&self, ns: &Namespace, text: &str) -> Result<Stored, StoreError> {
        let stored = SchemaRecord::decode(ns.as_str(), text.as_bytes())?;
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.insert(ns.clone(), stored.clone());
        Ok(stored)
    }

    /// Replaces a namespace's schema record by `change(current)` with a compare-and-set (a
    /// concurrent change makes us read again, a few times at most); `None` from `change`
    /// leaves it as it is. Answers the record stored now, if any.
    pub(crate) async fn update_record(
        &self,
        ns: &Namespace,
        change: impl Fn(Option<&SchemaRecord>) -> Option<SchemaRecord>,
    ) -> Result<Option<Stored>, StoreError> {
        for _ in 0..16 {
            let (current, previous) = self.read_record(ns).await?;
            let Some(record) = change(previous.as_ref().map(|p| &p.record)) else {
                return Ok(previous);
            };
            if let Some(stored) = self.swap_record(ns, &current, &record.encode()?).await? {
                return Ok(Some(stored));
            }
        }
        Err(self.kept_changing(ns))
    }

    pub(crate) fn kept_changing(&self, ns: &Namespace) -> StoreError {
        StoreError::unavailable(format!(
            "{}: the schema of {ns} kept changing under us; try again",
            self.label
        ))
    }

    /// Gives the `(resolution, dimension)` pairs that have none a code and confirms the
    /// pending codes among them, so that writes may use them: the record holding them pending
    /// is written (or, if another server gave them, written again unchanged), then every
    /// replica of the schemas hash's node must acknowledge that write (`WAIT`) before a
    /// second compare-and-set confirms them. A failover can then lose a confirmation but not
    /// a code some field uses. If the replicas do not answer in time, the codes stay pending
    /// and this batch writes spelled-out fields. Answers the record stored now, if any.
    pub(crate) async fn secure_codes(
        &self,
        ns: &Namespace,
        pairs: &[(u64, &str)],
    ) -> Result<Option<Stored>, StoreError> {
        let backing_off = {
            let after = self
                .confirm_after
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            after
                .get(ns)
                .is_some_and(|t| std::time::Instant::now() < *t)
        };
        if backing_off {
            return Ok(None);
        }
        let mut replicas = None;
        for _ in 0..16 {
            let (current, previous) = self.read_record(ns).await?;
            let Some(previous) = previous else {
                return Ok(None);
            };
            let given = previous.record.with_codes(pairs);
            let pending = given.as_ref().unwrap_or(&previous.record);
            if !pending.has_pending(pairs) {
                return Ok(Some(previous));
            }
            let replicas = match replicas {
                Some(n) => n,
                None => *replicas.insert(self.schema_replicas().await?),
            };
            let confirmed = pending.confirmed(pairs).unwrap_or_else(|| pending.clone());
            if replicas == Some(0) {
                // No replica that a failover could promote without this write.
                if let Some(stored) = self.swap_record(ns, &current, &confirmed.encode()?).await? {
                    return Ok(Some(stored));
                }
                continue;
            }
            let text = pending.encode()?;
            // Replicas not known: wait for one, and keep the codes pending anyway.
            let wanted = replicas.unwrap_or(1).max(1);
            let (swapped, acked) = self.swap_and_wait(ns, &current, &text, wanted).await?;
            if !swapped {
                continue;
            }
            if replicas.is_none() || acked < wanted {
                tracing::warn!(
                    %ns,
                    acked,
                    replicas = ?replicas,
                    "the schemas node's replicas did not acknowledge new dimension codes in \
                     time (or could not be counted): they stay pending, and subtotals are \
                     spelled out meanwhile"
                );
                self.confirm_after
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(ns.clone(), std::time::Instant::now() + CONFIRM_BACKOFF);
                return Ok(Some(SchemaRecord::decode(ns.as_str(), text.as_bytes())?));
            }
            if let Some(stored) = self
                .swap_record(ns, text.as_bytes(), &confirmed.encode()?)
                .await?
            {
                return Ok(Some(stored));
            }
        }
        Err(self.kept_changing(ns))
    }

    /// How many replicas the node holding the schemas hash has, `None` if its answer does
    /// not say. In a cluster, every replica the cluster knows of that master (`CLUSTER
    /// NODES`), connected or not, since a failover may promote one whose link is down; on a
    /// single server, the connected ones (`INFO replication`).
    pub(crate) async fn schema_replicas(&self) -> Result<Option<i64>, StoreError> {
        let cluster = self.is_cluster();
        let answer = self
            .retry(|c| {
                let cmd = if cluster {
                    let mut nodes = redis::cmd("CLUSTER");
                    nodes.arg("NODES");
                    nodes
                } else {
                    let mut info = redis::cmd("INFO");
                    info.arg("replication");
                    info
                };
                c.on_node_of(SCHEMAS_KEY, cmd)
            })
            .await?;
        let mut texts = Vec::new();
        collect_text(&answer, &mut texts);
        let text = texts.join("\n");
        Ok(if cluster {
            layout::replicas_of_myself(&text)
        } else {
            text.lines()
                .find_map(|l| l.strip_prefix("connected_slaves:"))
                .and_then(|n| n.trim().parse().ok())
        })
    }

    /// [`RedisStore::swap_record`] and, on the same connection right after it, `WAIT` for
    /// `replicas` replicas (at most `REPLICA_WAIT`): whether it swapped, and how many
    /// replicas acknowledged every write of this connection up to it. Not retried: a
    /// reconnection between the two would make the `WAIT` answer for another connection.
    pub(crate) async fn swap_and_wait(
        &self,
        ns: &Namespace,
        current: &[u8],
        text: &str,
        replicas: i64,
    ) -> Result<(bool, i64), StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVAL")
            .arg(scripts::PUT_SCHEMA_LUA)
            .arg(1)
            .arg(SCHEMAS_KEY)
            .arg(ns.as_str())
            .arg(current)
            .arg(text)
            .cmd("WAIT")
            .arg(replicas)
            .arg(REPLICA_WAIT.as_millis() as u64);
        let mut c = self.side();
        let (done, acked): (i64, i64) = pipe.query_async(&mut c).await.map_err(|e| self.err(e))?;
        if done == 1 {
            self.remember(ns, text)?;
        }
        Ok((done == 1, acked))
    }

    /// After the layout version is marked, rewrites every schema record that is not in this
    /// layout's form, so that builds of older layouts still running cannot decode them (and
    /// fail loudly) instead of rewriting them without what they do not know.
    pub(crate) async fn rewrite_records(&self) -> Result<(), StoreError> {
        for (ns, _) in self.all_records().await? {
            self.update_record(&ns, |current| {
                let current = current?;
                (current.layout != LAYOUT_VERSION).then(|| current.clone())
            })
            .await?;
        }
        Ok(())
    }
}
