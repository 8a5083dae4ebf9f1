//! Retention that grows: a tier that keeps its data under a longer retention (or `forever`)
//! must keep what the shorter one still held, but its window hashes' `EXPIREAT`s and the
//! key index's expiries were set for the shorter one. The schema record marks such tiers
//! (`extend`); this walks their window hashes and extends those expiries (never shortens
//! them, so two servers doing it at once, or a later change, lose nothing), then clears
//! the mark it did. A server connecting finishes what an interrupted one left.

use std::collections::BTreeMap;
use std::time::Duration as StdDuration;

use futures_util::future::join_all;
use tally_core::model::{Duration, Namespace, Retention};
use tally_core::store::StoreError;

use crate::layout;
use crate::{RedisStore, scripts};

/// Window hash names asked for per `SCAN` call.
const SCAN_COUNT: usize = 1000;
/// Batches prepared under the schema before the change have this long to be applied before
/// the expiries are extended. (One applied later cannot shorten an expiry, since `APPLY`
/// only raises them, but a window hash it creates gets the shorter one.)
const SETTLE: StdDuration = StdDuration::from_secs(1);
/// Members per call of the index script.
const INDEX_CHUNK: usize = 256;

impl RedisStore {
    /// Extends the expiries of every tier of `ns` its record marks (`extend`), after
    /// [`SETTLE`] if `settle`, and clears each mark it did.
    pub(crate) async fn extend_expiries(
        &self,
        ns: &Namespace,
        settle: bool,
    ) -> Result<(), StoreError> {
        if settle {
            tokio::time::sleep(SETTLE).await;
        }
        let (_, Some(stored)) = self.read_record(ns).await? else {
            return Ok(());
        };
        for (&r, &mark) in &stored.record.extend {
            let Some(res) = Duration::from_secs(r) else {
                continue;
            };
            let (Some(tier), Some(gen_)) = (stored.tier(res), stored.generation(res)) else {
                continue;
            };
            self.extend_tier(ns, gen_, r as i64, tier.retention).await?;
            // Done; a change since that grew the retention again marked it afresh. What
            // expired under the old retention until now is gone: the tier is whole from now
            // less that retention.
            let done = self.clock.now();
            self.update_record(ns, |current| {
                let current = current?;
                (current.extend.get(&r) == Some(&mark)).then(|| {
                    let mut next = current.clone();
                    next.hold_growth(r, done);
                    next.extend.remove(&r);
                    next.extend_from.remove(&r);
                    next
                })
            })
            .await?;
        }
        Ok(())
    }

    /// Finishes the extensions interrupted servers left, namespace by namespace; one that
    /// fails is logged and left for the next server or schema change.
    pub(crate) async fn resume_extends(&self) -> Result<(), StoreError> {
        for (ns, stored) in self.all_records().await? {
            if stored.record.extend.is_empty() {
                continue;
            }
            if let Err(e) = self.extend_expiries(&ns, false).await {
                tracing::warn!(
                    error = %e.detail(),
                    %ns,
                    "could not finish extending the expiries of tiers whose retention grew; \
                     the next server to connect, or the next schema change, tries again"
                );
            }
        }
        Ok(())
    }

    /// One tier generation's window hashes, node by node and page by page: `EXPIREAT … GT`
    /// (or `PERSIST` for `forever`), then the key index's expiry of each series the page
    /// holds (from its latest window there; `ZADD GT` makes the pages' order irrelevant).
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
            let mut cursor = 0u64;
            loop {
                let (next, names) = self
                    .retry(|c| {
                        let (node, pattern) = (node.clone(), &pattern);
                        async move { c.scan_page(node, cursor, pattern, SCAN_COUNT).await }
                    })
                    .await?;
                let mut latest: BTreeMap<String, i64> = BTreeMap::new();
                let mut found = Vec::with_capacity(names.len());
                for name in names {
                    if let Some((key, window)) = layout::parse_window_key(&name, ns, gen_, res) {
                        let w = latest.entry(key).or_insert(window);
                        *w = (*w).max(window);
                        found.push((name, window));
                    }
                }
                let done = join_all(found.iter().map(|(name, window)| {
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
                self.extend_index(ns, gen_, res, retention, &latest).await?;
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Raises each series' expiry in the key index to its last bucket's under `retention`
    /// (the last in `window`, its latest window found), or makes it unexpiring for
    /// `forever`; lists it again if it was pruned (`EXTEND_INDEX`).
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
                let name = layout::window_key(&layout::series_tag(ns, key), gen_, res, window);
                let last: i64 = self
                    .retry(|mut c| {
                        let name = &name;
                        async move {
                            scripts::LAST_OFFSET
                                .key(name)
                                .arg(layout::WINDOW_BUCKETS - 1)
                                .invoke_async(&mut c)
                                .await
                        }
                    })
                    .await?;
                // A hash gone meanwhile (expired) holds nothing to keep.
                let score = (last >= 0).then(|| {
                    layout::bucket_expiry(window + last * res, res, retention)
                        .map_or_else(|| "inf".to_owned(), |t| t.to_string())
                });
                Ok::<_, StoreError>(score.map(|s| (key, s)))
            }))
            .await
            .into_iter()
            .filter_map(Result::transpose)
            .collect::<Result<Vec<_>, _>>()?;
            if scores.is_empty() {
                continue;
            }
            let (dir, expiry) = (layout::key_dir_key(ns), layout::expiry_key(ns));
            let pfx = layout::key_page_prefix(ns);
            self.retry(|mut c| {
                let (scores, dir, expiry, pfx) = (&scores, &dir, &expiry, &pfx);
                async move {
                    let mut inv = scripts::EXTEND_INDEX.prepare_invoke();
                    inv.key(dir).key(expiry);
                    inv.arg(pfx).arg(self.index_page);
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
