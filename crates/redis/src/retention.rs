//! Retention that grows: a tier that keeps its data under a longer retention (or `forever`)
//! must keep what the shorter one still held, but its window hashes' `EXPIREAT`s and the
//! key index's expiries were set for the shorter one. The schema record lists such tiers
//! (`extend`); this walks their window hashes and extends those expiries (never shortens
//! them, so two servers doing it at once, or a later change, lose nothing), then clears
//! the mark. A server connecting finishes what an interrupted one left.

use std::collections::BTreeMap;
use std::time::Duration as StdDuration;

use futures_util::future::join_all;
use tally_core::model::{Namespace, Retention};
use tally_core::store::StoreError;

use crate::layout::{self, Field, SCHEMAS_KEY, SchemaRecord};
use crate::{RedisStore, scripts};

/// Window hash names asked for per `SCAN` call.
const SCAN_COUNT: usize = 1000;
/// Batches prepared under the schema before the change have this long to be applied before
/// the expiries are extended (a batch applied later could set the shorter expiry again on a
/// window it writes).
const SETTLE: StdDuration = StdDuration::from_secs(1);
/// Members per call of the index script.
const INDEX_CHUNK: usize = 256;

impl RedisStore {
    /// Extends the expiries of every tier of `ns` its record marks (`extend`), after
    /// [`SETTLE`], and clears each mark once done.
    pub(crate) async fn extend_expiries(&self, ns: &Namespace) -> Result<(), StoreError> {
        let (_, Some(stored)) = self.read_record(ns).await? else {
            return Ok(());
        };
        if stored.record.extend.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(SETTLE).await;
        for &r in &stored.record.extend {
            let Some(res) = tally_core::model::Duration::from_secs(r) else {
                continue;
            };
            let (Some(tier), Some(gen_)) = (stored.tier(res), stored.generation(res)) else {
                continue;
            };
            let retention = tier.retention;
            self.extend_tier(ns, gen_, r as i64, retention).await?;
            // Done for this retention; a change since (which marked the tier again if it
            // grew further) keeps its mark.
            self.update_record(ns, |current| {
                let current = current?;
                let same = current.generation.get(&r) == Some(&gen_)
                    && retention_in(current, r) == Some(retention);
                (same && current.extend.contains(&r)).then(|| {
                    let mut next = current.clone();
                    next.extend.remove(&r);
                    next
                })
            })
            .await?;
        }
        Ok(())
    }

    /// Finishes the extensions an interrupted server left, for every namespace.
    pub(crate) async fn resume_extends(&self) -> Result<(), StoreError> {
        let all: Vec<(String, Vec<u8>)> = self
            .retry(|mut c| async move {
                redis::cmd("HGETALL")
                    .arg(SCHEMAS_KEY)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        for (name, text) in all {
            let stored = SchemaRecord::decode(&name, &text)?;
            if stored.record.extend.is_empty() {
                continue;
            }
            let ns = Namespace::new(&name).map_err(|e| {
                StoreError::corrupt(format!("{SCHEMAS_KEY} holds an invalid namespace name"))
                    .because(e)
            })?;
            self.extend_expiries(&ns).await?;
        }
        Ok(())
    }

    /// One tier generation's window hashes, node by node, page by page: `EXPIREAT … GT` (or
    /// `PERSIST` for `forever`), then the key index's expiry of each series found.
    async fn extend_tier(
        &self,
        ns: &Namespace,
        gen_: u64,
        res: i64,
        retention: Retention,
    ) -> Result<(), StoreError> {
        let pattern = layout::windows_pattern(ns, gen_, res);
        let nodes = self.retry(|c| async move { c.scan_nodes().await }).await?;
        for node in nodes {
            // Each series' latest window on this node (a series lies on one node).
            let mut latest: BTreeMap<String, i64> = BTreeMap::new();
            let mut cursor = 0u64;
            loop {
                let (next, names) = self
                    .retry(|c| {
                        let (node, pattern) = (node.clone(), &pattern);
                        async move { c.scan_page(node, cursor, pattern, SCAN_COUNT).await }
                    })
                    .await?;
                let found: Vec<(String, String, i64)> = names
                    .into_iter()
                    .filter_map(|name| {
                        let (key, window) = layout::parse_window_key(&name, ns, gen_, res)?;
                        Some((name, key, window))
                    })
                    .collect();
                let done = join_all(found.iter().map(|(name, _, window)| {
                    let expire_at = layout::window_expiry(*window, res, retention);
                    self.retry(move |mut c| async move {
                        let cmd = match expire_at {
                            Some(t) => {
                                let mut cmd = redis::cmd("EXPIREAT");
                                cmd.arg(name).arg(t).arg("GT");
                                cmd
                            }
                            None => {
                                let mut cmd = redis::cmd("PERSIST");
                                cmd.arg(name);
                                cmd
                            }
                        };
                        cmd.query_async::<i64>(&mut c).await
                    })
                }))
                .await;
                done.into_iter().try_for_each(|r| r.map(|_| ()))?;
                for (_, key, window) in found {
                    let w = latest.entry(key).or_insert(window);
                    *w = (*w).max(window);
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
            self.extend_index(ns, gen_, res, retention, &latest).await?;
        }
        Ok(())
    }

    /// Raises each series' expiry in the key index to its last bucket's under `retention`
    /// (found in its latest window), or makes it unexpiring for `forever`; only for keys
    /// that have an expiry there (one without is held unexpiring already).
    async fn extend_index(
        &self,
        ns: &Namespace,
        gen_: u64,
        res: i64,
        retention: Retention,
        latest: &BTreeMap<String, i64>,
    ) -> Result<(), StoreError> {
        let series: Vec<(&String, &i64)> = latest.iter().collect();
        for chunk in series.chunks(INDEX_CHUNK) {
            let scores = join_all(chunk.iter().map(|&(key, &window)| async move {
                let Some(_) = retention_expiry(retention) else {
                    return Ok::<_, StoreError>((key, "inf".to_owned()));
                };
                let name = layout::window_key(&layout::series_tag(ns, key), gen_, res, window);
                let fields: Vec<String> = self
                    .retry(|mut c| {
                        let name = &name;
                        async move { redis::cmd("HKEYS").arg(name).query_async(&mut c).await }
                    })
                    .await?;
                let last = fields
                    .iter()
                    .filter_map(|f| match Field::parse(f)? {
                        Field::Total { offset }
                        | Field::Subtotal { offset, .. }
                        | Field::Coded { offset, .. } => Some(offset),
                    })
                    .max()
                    .unwrap_or(layout::WINDOW_BUCKETS - 1);
                let bucket = window + last * res;
                let score = layout::bucket_expiry(bucket, res, retention)
                    .map_or_else(|| "inf".to_owned(), |t| t.to_string());
                Ok((key, score))
            }))
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
            let expiry = layout::expiry_key(ns);
            self.retry(|mut c| {
                let (scores, expiry) = (&scores, &expiry);
                async move {
                    let mut inv = scripts::EXTEND_INDEX.prepare_invoke();
                    inv.key(expiry);
                    for (key, score) in scores {
                        inv.arg(key.as_str()).arg(score.as_str());
                    }
                    inv.invoke_async::<i64>(&mut c).await
                }
            })
            .await?;
        }
        Ok(())
    }
}

/// `Some(())` for a finite retention.
fn retention_expiry(retention: Retention) -> Option<()> {
    match retention {
        Retention::Forever => None,
        Retention::For(_) => Some(()),
    }
}

/// A record's retention of the tier of resolution `r` seconds.
fn retention_in(record: &SchemaRecord, r: u64) -> Option<Retention> {
    let schema = tally_core::model::Schema::from_doc(&record.schema).ok()?;
    let t = schema.tiers().iter().find(|t| t.resolution.secs() == r)?;
    Some(t.retention)
}
