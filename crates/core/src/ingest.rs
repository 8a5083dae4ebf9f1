//! From raw events to a validated [`Batch`]: every rule of SPEC §1, the allow-lists, the
//! `[limits]`, and auto-creation of namespaces from `[defaults]`. All or nothing: the first
//! bad event fails the whole batch and is named by its index.

use std::collections::BTreeMap;

use crate::error::ErrorCode;
use crate::model::{Event, ModelError, Namespace, RawEvent, Schema};
use crate::store::{Batch, Increment, Store, StoreError};

/// `[limits]` of the config file, with the SPEC's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_batch_events: usize,
    pub max_points: usize,
    pub max_future_secs: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 * 1024 * 1024,
            max_batch_events: 100_000,
            max_points: 100_000,
            max_future_secs: 3600,
        }
    }
}

/// `[defaults]`: the schema of namespaces created on first write, and whether they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub schema: Schema,
    pub auto_create: bool,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            schema: Schema::default(),
            auto_create: true,
        }
    }
}

/// Why a batch was refused.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IngestError {
    #[error("event {index}: {source}")]
    Event { index: usize, source: ModelError },
    #[error("event {index}: namespace {ns} does not exist (auto_create is off)")]
    UnknownNamespace { index: usize, ns: String },
    #[error("a batch holds at most {max} events, got {got}")]
    BatchTooLarge { got: usize, max: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl IngestError {
    pub fn code(&self) -> ErrorCode {
        match self {
            IngestError::Event { source, .. } => source.code(),
            IngestError::UnknownNamespace { .. } => ErrorCode::UnknownNamespace,
            IngestError::BatchTooLarge { .. } => ErrorCode::BatchTooLarge,
            IngestError::Store(e) => e.code(),
        }
    }

    /// The 0-based index of the event at fault.
    pub fn index(&self) -> Option<usize> {
        match self {
            IngestError::Event { index, .. } | IngestError::UnknownNamespace { index, .. } => {
                Some(*index)
            }
            _ => None,
        }
    }
}

/// Validates `raws` against the namespaces in `store` (creating missing ones per
/// `defaults`, in the batch itself so a refused batch creates nothing).
pub fn prepare(
    store: &dyn Store,
    raws: &[RawEvent],
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
) -> Result<Batch, IngestError> {
    prepare_owned(store, raws.to_vec(), now, limits, defaults)
}

/// As [`prepare`], taking the events by value so their strings move into the batch.
pub fn prepare_owned(
    store: &dyn Store,
    raws: Vec<RawEvent>,
    now: i64,
    limits: &Limits,
    defaults: &Defaults,
) -> Result<Batch, IngestError> {
    if raws.len() > limits.max_batch_events {
        return Err(IngestError::BatchTooLarge {
            got: raws.len(),
            max: limits.max_batch_events,
        });
    }
    let mut schemas: BTreeMap<Namespace, Schema> = BTreeMap::new();
    let mut batch = Batch::default();
    batch.increments.reserve(raws.len());
    for (index, raw) in raws.into_iter().enumerate() {
        let at = |source| IngestError::Event { index, source };
        let event = Event::validate_owned(raw, now, limits.max_future_secs).map_err(at)?;
        if !schemas.contains_key(&event.ns) {
            let schema = match store.schema(&event.ns)? {
                Some(s) => s,
                None if defaults.auto_create => {
                    batch
                        .create
                        .push((event.ns.clone(), defaults.schema.clone()));
                    defaults.schema.clone()
                }
                None => {
                    return Err(IngestError::UnknownNamespace {
                        index,
                        ns: event.ns.to_string(),
                    });
                }
            };
            schemas.insert(event.ns.clone(), schema);
        }
        let subtotals = match schemas.get(&event.ns) {
            Some(schema) => schema.subtotals_owned(event.dims).map_err(at)?,
            None => Vec::new(),
        };
        batch.increments.push(Increment {
            ns: event.ns,
            key: event.key,
            ts: event.ts,
            n: event.n,
            subtotals,
        });
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_schema_is_the_spec_default() {
        let d = Defaults::default();
        assert!(d.auto_create);
        assert_eq!(
            d.schema.to_doc().tiers,
            vec!["1m:2d".to_owned(), "1h:forever".to_owned()]
        );
    }
}
