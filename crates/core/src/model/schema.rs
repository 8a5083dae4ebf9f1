//! A namespace's schema: its tiers, its breakdown tiers, an optional dimension allow-list,
//! its wire form, and the subtotals an event adds to under it.

use std::collections::BTreeMap;

use super::{
    DimName, DimValue, Dimension, Duration, MAX_COMPOUNDS, MAX_DIM_VALUE_BYTES,
    MAX_SCHEMA_DIMENSIONS, MAX_TIERS, ModelError, Retention, Tier,
};

/// The schema of a namespace: its tiers, which of them keep breakdowns, and an optional
/// allow-list of dimensions (`None` = any simple dimension); with the [`Coverage`] its
/// changes left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// Sorted finest first; resolutions are unique.
    tiers: Vec<Tier>,
    /// Resolutions of the tiers that keep subtotals, sorted finest first.
    breakdown: Vec<Duration>,
    dimensions: Option<Vec<Dimension>>,
    coverage: Coverage,
}

/// Since when a namespace's counters hold every event, where a schema change made that
/// later than the namespace's creation (SPEC §1: "a new tier starts empty"). A tier added by
/// a change, a tier that starts keeping breakdowns, a dimension the allow-list starts
/// counting hold nothing from before it; a tier whose retention grows holds only what the
/// old retention kept. Each is whole from the change on — plus the future an event may be
/// dated in (`[limits] max_future_secs`), since an event dated after the change may have
/// been counted before it. Queries refuse a range such a part cannot answer whole, rather
/// than answer a number too small (SPEC §2). Empty for a namespace as created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Tier resolution → the instant its totals are whole from.
    pub totals: BTreeMap<Duration, i64>,
    /// Breakdown tier resolution → the instant its subtotals are whole from.
    pub subtotals: BTreeMap<Duration, i64>,
    /// Dimension name → the instant it is counted whole from.
    pub dims: BTreeMap<String, i64>,
    /// Without an allow-list: the instant simple dimensions not in `dims` are whole from
    /// (the allow-list that held only some of them was dropped then).
    pub others: Option<i64>,
}

impl Coverage {
    pub fn is_empty(&self) -> bool {
        *self == Coverage::default()
    }
}

/// What a query reads of a tier, for [`Schema::whole_from`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads<'a> {
    Totals,
    /// Totals and subtotals, of every dimension.
    Subtotals,
    /// Totals and the subtotals of one dimension.
    Dimension(&'a str),
}

fn later(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    a.max(b)
}

/// The SPEC's `[defaults]` schema: `1m:48h` and `1h:forever`, breakdowns in `1h`.
impl Default for Schema {
    fn default() -> Self {
        Schema {
            tiers: vec![
                Tier {
                    resolution: Duration(60),
                    retention: Retention::For(Duration(172_800)),
                },
                Tier {
                    resolution: Duration(3600),
                    retention: Retention::Forever,
                },
            ],
            breakdown: vec![Duration(3600)],
            dimensions: None,
            coverage: Coverage::default(),
        }
    }
}

/// The wire form of a schema (`PUT /v1/ns/{ns}`, the config file): strings to validate.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaDoc {
    pub tiers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breakdown_tiers: Option<Vec<String>>,
    #[serde(default)]
    pub dimensions: Option<Vec<String>>,
}

impl Schema {
    pub fn new(
        mut tiers: Vec<Tier>,
        breakdown: Option<Vec<Duration>>,
        dimensions: Option<Vec<Dimension>>,
    ) -> Result<Self, ModelError> {
        let err = |field, why: String| ModelError::InvalidSchema { why, field };
        if tiers.is_empty() {
            return Err(err("tiers", "a namespace needs at least one tier".into()));
        }
        tiers.sort_by_key(|t| t.resolution);
        if let Some(w) = tiers
            .windows(2)
            .find(|w| w[0].resolution == w[1].resolution)
        {
            return Err(err(
                "tiers",
                format!("two tiers have the resolution {}", w[0].resolution),
            ));
        }
        let mut breakdown = match breakdown {
            Some(b) => b,
            None => tiers.last().map(|t| t.resolution).into_iter().collect(),
        };
        breakdown.sort();
        breakdown.dedup();
        if let Some(b) = breakdown
            .iter()
            .find(|b| !tiers.iter().any(|t| t.resolution == **b))
        {
            return Err(err(
                "breakdown_tiers",
                format!("breakdown tier {b} is not one of the tiers"),
            ));
        }
        if let Some(dims) = &dimensions {
            let mut seen = std::collections::HashSet::new();
            if let Some(d) = dims.iter().find(|d| !seen.insert(d.name())) {
                return Err(err("dimensions", format!("dimension {d} is listed twice")));
            }
        }
        Ok(Schema {
            tiers,
            breakdown,
            dimensions,
            coverage: Coverage::default(),
        })
    }

    /// Whether two schemas declare the same tiers, breakdown tiers and dimensions, whatever
    /// their coverage.
    pub fn declares_same(&self, other: &Schema) -> bool {
        self.tiers == other.tiers
            && self.breakdown == other.breakdown
            && self.dimensions == other.dimensions
    }

    pub fn coverage(&self) -> &Coverage {
        &self.coverage
    }

    /// This schema with `coverage` (as stored with it).
    pub fn with_coverage(mut self, coverage: Coverage) -> Schema {
        self.coverage = coverage;
        self
    }

    /// This schema as it replaces `old` at `now` (none: it creates the namespace), with the
    /// coverage the change leaves: what it adds is whole from the second after `now +
    /// max_future_secs`, a grown retention from `now` less the old retention, the rest as
    /// before. Every store stores a schema through this, under the lock that orders its
    /// schema changes against its writes, with `now` read under it.
    pub fn replacing(self, old: Option<&Schema>, now: i64, max_future_secs: i64) -> Schema {
        let Some(old) = old else {
            return self.with_coverage(Coverage::default());
        };
        // An event dated `now + max_future_secs` is still accepted (only later ones are
        // refused), so one counted just before the change may be dated that second.
        let start = now.saturating_add(max_future_secs.max(0)).saturating_add(1);
        let mut c = Coverage::default();
        for t in &self.tiers {
            let r = t.resolution;
            let before = old.tiers.iter().find(|o| o.resolution == r);
            let grown = before.and_then(|o| match (o.retention, t.retention) {
                (Retention::For(a), Retention::Forever) => Some(now.saturating_sub(a.secs_i64())),
                (Retention::For(a), Retention::For(b)) if b > a => {
                    Some(now.saturating_sub(a.secs_i64()))
                }
                _ => None,
            });
            let totals = match before {
                None => Some(start),
                Some(_) => later(old.coverage.totals.get(&r).copied(), grown),
            };
            // Once the retention has passed it, a mark no longer matters.
            let live = |s: &i64| t.retention.holds_from(*s, now);
            if let Some(s) = totals.filter(live) {
                c.totals.insert(r, s);
            }
            if self.is_breakdown(r) {
                let subtotals = if before.is_some() && old.is_breakdown(r) {
                    later(old.coverage.subtotals.get(&r).copied(), grown)
                } else {
                    Some(start)
                };
                if let Some(s) = subtotals.filter(live) {
                    c.subtotals.insert(r, s);
                }
            }
        }
        match &self.dimensions {
            Some(list) => {
                for d in list {
                    let since = if old.counts_dimension(d.name()) {
                        old.dimension_from(d.name())
                    } else {
                        Some(start)
                    };
                    if let Some(s) = since {
                        c.dims.insert(d.name().to_owned(), s);
                    }
                }
            }
            None => match &old.dimensions {
                None => {
                    c.dims = old.coverage.dims.clone();
                    c.others = old.coverage.others;
                }
                Some(list) => {
                    // The listed simple dimensions go on as they were — whole always, when
                    // they have no mark (`i64::MIN`: `others` no longer speaks for them).
                    for d in list.iter().filter(|d| !d.name().contains('+')) {
                        let s = old.dimension_from(d.name()).unwrap_or(i64::MIN);
                        c.dims.insert(d.name().to_owned(), s);
                    }
                    c.others = Some(start);
                }
            },
        }
        self.with_coverage(c)
    }

    /// Whether events were counted under dimension `name` (simple or compound, canonical).
    fn counts_dimension(&self, name: &str) -> bool {
        match &self.dimensions {
            None => !name.contains('+'),
            Some(dims) => dims.iter().any(|d| d.name() == name),
        }
    }

    /// The instant dimension `name` is counted whole from (none: always).
    fn dimension_from(&self, name: &str) -> Option<i64> {
        match self.coverage.dims.get(name) {
            Some(s) => Some(*s),
            None if self.dimensions.is_none() => self.coverage.others,
            None => None,
        }
    }

    /// The instant from which the tier of `resolution` holds every event for what a query
    /// `reads` (none: since the namespace was created).
    pub fn whole_from(&self, resolution: Duration, reads: Reads<'_>) -> Option<i64> {
        let c = &self.coverage;
        let totals = c.totals.get(&resolution).copied();
        match reads {
            Reads::Totals => totals,
            Reads::Subtotals => later(totals, c.subtotals.get(&resolution).copied()),
            Reads::Dimension(d) => later(
                later(totals, c.subtotals.get(&resolution).copied()),
                self.dimension_from(d),
            ),
        }
    }

    /// Validates a schema a user gives (`PUT /v1/ns/{ns}`, the config file): the wire form,
    /// and the bounds on its size — at most [`MAX_TIERS`] tiers, [`MAX_SCHEMA_DIMENSIONS`]
    /// names in the allow-list, [`MAX_COMPOUNDS`] compounds. Stored schemas are decoded with
    /// [`Schema::from_doc`], without the bounds: a schema an older build accepted still opens.
    pub fn from_input(doc: &SchemaDoc) -> Result<Self, ModelError> {
        let err = |field, why: String| ModelError::InvalidSchema { why, field };
        if doc.tiers.len() > MAX_TIERS {
            return Err(err(
                "tiers",
                format!(
                    "a namespace has at most {MAX_TIERS} tiers, got {}",
                    doc.tiers.len()
                ),
            ));
        }
        if let Some(dims) = &doc.dimensions {
            if dims.len() > MAX_SCHEMA_DIMENSIONS {
                return Err(err(
                    "dimensions",
                    format!(
                        "the dimension allow-list holds at most {MAX_SCHEMA_DIMENSIONS} names, got {}",
                        dims.len()
                    ),
                ));
            }
            let compounds = dims.iter().filter(|d| d.contains('+')).count();
            if compounds > MAX_COMPOUNDS {
                return Err(err(
                    "dimensions",
                    format!(
                        "a namespace declares at most {MAX_COMPOUNDS} compound dimensions, got \
                     {compounds}"
                    ),
                ));
            }
        }
        if let Some(list) = &doc.breakdown_tiers {
            // Each is one of the tiers, named once: at most as many (checked first, so that
            // a body of millions of entries is not compared pair by pair).
            if list.len() > MAX_TIERS {
                return Err(err(
                    "breakdown_tiers",
                    format!(
                        "a namespace has at most {MAX_TIERS} breakdown tiers, got {}",
                        list.len()
                    ),
                ));
            }
            let parsed: Vec<Option<Duration>> =
                list.iter().map(|b| Duration::new(b).ok()).collect();
            for (i, b) in list.iter().enumerate() {
                let same = |j: &usize| parsed[*j].is_some() && parsed[*j] == parsed[i];
                if let Some(first) = (0..i).find(same).map(|j| &list[j]) {
                    let why = if first == b {
                        format!("breakdown tier {b} is listed twice")
                    } else {
                        format!("breakdown tiers {first} and {b} are the same resolution")
                    };
                    return Err(err("breakdown_tiers", why));
                }
            }
        }
        let schema = Schema::from_doc(doc)?;
        // A compound is the combination of its parts: `b+a` counts what `a+b` counts, in
        // another order of its value's parts. (Stored schemas that hold both still open.)
        if let Some(dims) = &schema.dimensions {
            let mut seen: Vec<(Vec<&DimName>, &Dimension)> = Vec::new();
            for d in dims.iter().filter(|d| d.is_compound()) {
                let mut parts: Vec<&DimName> = d.parts().iter().collect();
                parts.sort();
                if let Some((_, first)) = seen.iter().find(|(p, _)| *p == parts) {
                    return Err(err(
                        "dimensions",
                        format!(
                            "compound {d} combines the same dimensions as {first}: declare one \
                             of them"
                        ),
                    ));
                }
                seen.push((parts, d));
            }
        }
        Ok(schema)
    }

    /// Validates the wire form (of a stored schema too: see [`Schema::from_input`]).
    pub fn from_doc(doc: &SchemaDoc) -> Result<Self, ModelError> {
        let tiers = doc
            .tiers
            .iter()
            .map(|t| Tier::new(t))
            .collect::<Result<Vec<_>, _>>()?;
        let breakdown = match &doc.breakdown_tiers {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|s| {
                        Duration::new(s).map_err(|e| ModelError::InvalidSchema {
                            why: format!("breakdown tier: {e}"),
                            field: "breakdown_tiers",
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        let dimensions = match &doc.dimensions {
            None => None,
            Some(list) => Some(
                list.iter()
                    .map(|s| {
                        Dimension::new(s).map_err(|e| ModelError::InvalidSchema {
                            why: e.to_string(),
                            field: "dimensions",
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Schema::new(tiers, breakdown, dimensions)
    }

    /// The canonical wire form: durations in canonical units, breakdown tiers explicit.
    pub fn to_doc(&self) -> SchemaDoc {
        SchemaDoc {
            tiers: self.tiers.iter().map(Tier::to_string).collect(),
            breakdown_tiers: Some(self.breakdown.iter().map(Duration::to_string).collect()),
            dimensions: self
                .dimensions
                .as_ref()
                .map(|d| d.iter().map(|d| d.name().to_owned()).collect()),
        }
    }

    /// The tiers, finest first.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// Whether an increment of `n` at `ts` adds to some counter at `now`: an amount other
    /// than 0, at a time some tier still keeps. One that does not is not counted and makes
    /// no key, in every store (else `keys` would list a key no count stands behind).
    pub fn counts(&self, ts: i64, n: i64, now: i64) -> bool {
        n != 0
            && self
                .tiers
                .iter()
                .any(|t| t.retention.keeps_time(ts, t.resolution, now))
    }

    /// The resolutions that keep subtotals, finest first.
    pub fn breakdown_resolutions(&self) -> &[Duration] {
        &self.breakdown
    }

    pub fn is_breakdown(&self, resolution: Duration) -> bool {
        self.breakdown.contains(&resolution)
    }

    /// The tiers that keep subtotals, finest first.
    pub fn breakdown_tiers(&self) -> impl Iterator<Item = &Tier> {
        self.tiers
            .iter()
            .filter(|t| self.breakdown.contains(&t.resolution))
    }

    pub fn dimensions(&self) -> Option<&[Dimension]> {
        self.dimensions.as_deref()
    }

    /// Whether `name` (simple or compound, canonical) may be queried in this namespace.
    pub fn knows_dimension(&self, name: &str) -> bool {
        match &self.dimensions {
            None => !name.contains('+') && DimName::new(name).is_ok(),
            Some(dims) => dims.iter().any(|d| d.name() == name),
        }
    }

    /// As [`Schema::subtotals`], moving the event's dimensions when there is no allow-list.
    pub fn subtotals_owned(
        &self,
        dims: Vec<(DimName, DimValue)>,
    ) -> Result<Vec<Subtotal>, ModelError> {
        match &self.dimensions {
            None => Ok(dims
                .into_iter()
                .map(|(n, v)| Subtotal {
                    dim: n.into_string(),
                    value: v.into_string(),
                })
                .collect()),
            Some(_) => self.subtotals(&dims),
        }
    }

    /// The subtotals one event adds to: `(dimension, value)` for every counted dimension it
    /// carries. Fails with `unknown_dimension` for a dimension outside the allow-list.
    pub fn subtotals(&self, dims: &[(DimName, DimValue)]) -> Result<Vec<Subtotal>, ModelError> {
        match &self.dimensions {
            None => Ok(dims
                .iter()
                .map(|(n, v)| Subtotal {
                    dim: n.as_str().to_owned(),
                    value: v.as_str().to_owned(),
                })
                .collect()),
            Some(allowed) => {
                for (n, _) in dims {
                    if !allowed.iter().any(|d| d.parts().contains(n)) {
                        return Err(ModelError::UnknownDimension {
                            name: n.as_str().to_owned(),
                        });
                    }
                }
                // A compound's value is its parts joined: held to a value's length, like
                // any other, so that 16 compounds of 16 long parts cannot make one event
                // count half a megabyte of values.
                allowed
                    .iter()
                    .filter_map(|d| d.value_of(dims).map(|value| (d, value)))
                    .map(|(d, value)| {
                        if value.len() > MAX_DIM_VALUE_BYTES {
                            return Err(ModelError::InvalidDimension {
                                what: format!("value of compound {}", d.name()),
                                why: format!(
                                    "its parts, joined, come to {} bytes; a value is 1 to \
                                     {MAX_DIM_VALUE_BYTES} bytes",
                                    value.len()
                                ),
                            });
                        }
                        Ok(Subtotal {
                            dim: d.name().to_owned(),
                            value,
                        })
                    })
                    .collect()
            }
        }
    }
}

/// One subtotal an event adds to: a dimension's canonical name and the (escaped) value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subtotal {
    pub dim: String,
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::model::{Event, RawEvent};

    #[test]
    fn an_increment_counts_if_some_tier_keeps_its_time_and_its_amount_is_not_0() {
        let doc = SchemaDoc {
            tiers: vec!["1m:1d".into(), "1h:30d".into()],
            breakdown_tiers: None,
            dimensions: None,
        };
        let s = Schema::from_doc(&doc).unwrap();
        let now = 1_790_827_200;
        let day = 86_400;
        for (ts, n, counts) in [
            (now - 60, 1, true),
            (now - 60, -3, true),
            (now - 60, 0, false),
            // The hourly tier alone keeps it.
            (now - 3 * day, 2, true),
            // The hour holding the last kept second is kept (a bucket goes whole).
            (now - 30 * day + 1, 1, true),
            (now - 30 * day - 3600, 1, false),
            (now - 40 * day, 5, false),
        ] {
            assert_eq!(s.counts(ts, n, now), counts, "ts {ts}, n {n}");
        }
        let forever = Schema::from_doc(&SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: None,
        })
        .unwrap();
        assert!(forever.counts(0, 1, now));
        assert!(!forever.counts(0, 0, now));
    }

    #[test]
    fn schema_defaults_and_checks() {
        let doc = SchemaDoc {
            tiers: vec!["1h:forever".into(), "1s:2h".into(), "1m:48h".into()],
            breakdown_tiers: None,
            dimensions: None,
        };
        let s = Schema::from_doc(&doc).unwrap();
        assert_eq!(
            s.to_doc(),
            SchemaDoc {
                tiers: vec!["1s:2h".into(), "1m:2d".into(), "1h:forever".into()],
                breakdown_tiers: Some(vec!["1h".into()]),
                dimensions: None,
            }
        );
        let bad = |tiers: &[&str], bd: Option<&[&str]>, dims: Option<&[&str]>| {
            let doc = SchemaDoc {
                tiers: tiers.iter().map(|s| s.to_string()).collect(),
                breakdown_tiers: bd.map(|b| b.iter().map(|s| s.to_string()).collect()),
                dimensions: dims.map(|b| b.iter().map(|s| s.to_string()).collect()),
            };
            Schema::from_doc(&doc).unwrap_err().code()
        };
        assert_eq!(bad(&[], None, None), ErrorCode::InvalidSchema);
        assert_eq!(
            bad(&["1h:forever", "60m:1d"], None, None),
            ErrorCode::InvalidSchema
        );
        assert_eq!(
            bad(&["1h:forever"], Some(&["1m"]), None),
            ErrorCode::InvalidSchema
        );
        assert_eq!(
            bad(&["1h:forever"], None, Some(&["a", "a"])),
            ErrorCode::InvalidSchema
        );
        assert_eq!(
            bad(&["1h:forever"], None, Some(&["A"])),
            ErrorCode::InvalidSchema
        );
        // Bounded: tiers, names in the allow-list, compounds (each costs every event a
        // subtotal). A list of 100 000 names took ~30 s to check for repeats.
        let list =
            |n: usize, f: &dyn Fn(usize) -> String| -> Vec<String> { (0..n).map(f).collect() };
        let check = |tiers: Vec<String>, dims: Option<Vec<String>>| {
            Schema::from_input(&SchemaDoc {
                tiers,
                breakdown_tiers: None,
                dimensions: dims,
            })
        };
        let res = [
            1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60, 120, 180, 240, 300, 360,
        ];
        let tiers = |n| list(n, &|i| format!("{}s:forever", res[i]));
        assert!(check(tiers(MAX_TIERS), None).is_ok());
        let err = check(tiers(MAX_TIERS + 1), None).unwrap_err();
        assert!(err.to_string().contains("at most 16 tiers"), "{err}");
        let names = |n| Some(list(n, &|i| format!("d{i}")));
        assert!(check(tiers(1), names(MAX_SCHEMA_DIMENSIONS)).is_ok());
        let err = check(tiers(1), names(MAX_SCHEMA_DIMENSIONS + 1)).unwrap_err();
        assert!(err.to_string().contains("at most 256 names"), "{err}");
        let err = check(tiers(1), names(100_000)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidSchema);
        let compounds = |n| Some(list(n, &|i| format!("a+b{i}")));
        assert!(check(tiers(1), compounds(MAX_COMPOUNDS)).is_ok());
        let err = check(tiers(1), compounds(MAX_COMPOUNDS + 1)).unwrap_err();
        assert!(err.to_string().contains("at most 16 compound"), "{err}");
        // Breakdown tiers are bounded as tiers are (a list of millions was compared pair by
        // pair when repeats were first refused).
        let many = SchemaDoc {
            tiers: tiers(1),
            breakdown_tiers: Some(vec!["1s".to_owned(); 1_000_000]),
            dimensions: None,
        };
        let err = Schema::from_input(&many).unwrap_err();
        assert!(
            err.to_string().contains("at most 16 breakdown tiers"),
            "{err}"
        );
        // A breakdown tier or a compound given twice, in any spelling, is refused (the
        // allow-list's names already were); a stored schema holding them still decodes.
        for (bd, dims, says) in [
            (&["1h", "1h"][..], None, "breakdown tier 1h is listed twice"),
            (
                &["1h", "60m"][..],
                None,
                "breakdown tiers 1h and 60m are the same resolution",
            ),
            (
                &["1h"][..],
                Some(&["a+b", "c", "b+a"][..]),
                "compound b+a combines the same dimensions as a+b",
            ),
            (
                &["1h"][..],
                Some(&["a+b+c", "c+a+b"][..]),
                "compound c+a+b combines the same dimensions as a+b+c",
            ),
        ] {
            let doc = SchemaDoc {
                tiers: vec!["1h:forever".into()],
                breakdown_tiers: Some(bd.iter().map(|s| s.to_string()).collect()),
                dimensions: dims.map(|d| d.iter().map(|s| s.to_string()).collect()),
            };
            let err = Schema::from_input(&doc).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidSchema);
            assert!(err.to_string().contains(says), "{err}");
            assert!(Schema::from_doc(&doc).is_ok());
        }
        // Compounds of other combinations, and a part alone beside its compound, are fine.
        let doc = SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: Some(vec!["a+b".into(), "a+c".into(), "a".into(), "a+b+c".into()]),
        };
        assert!(Schema::from_input(&doc).is_ok());
        // A stored schema past the bounds (an older build took any) still decodes.
        let doc = SchemaDoc {
            tiers: tiers(1),
            breakdown_tiers: None,
            dimensions: names(MAX_SCHEMA_DIMENSIONS + 1),
        };
        assert!(Schema::from_doc(&doc).is_ok());
    }

    #[test]
    fn subtotals_follow_the_allow_list() {
        let doc = SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: Some(vec!["status".into(), "status+outcome".into()]),
        };
        let s = Schema::from_doc(&doc).unwrap();
        let raw = RawEvent {
            ns: "api".into(),
            key: "k".into(),
            dims: vec![
                ("status".into(), "200".into()),
                ("outcome".into(), "ok".into()),
            ],
            ..RawEvent::default()
        };
        let e = Event::validate(&raw, 1000, 3600).unwrap();
        let subs = s.subtotals(&e.dims).unwrap();
        assert_eq!(
            subs,
            vec![
                Subtotal {
                    dim: "status".into(),
                    value: "200".into()
                },
                Subtotal {
                    dim: "status+outcome".into(),
                    value: "200|ok".into()
                },
            ]
        );
        let raw = RawEvent {
            dims: vec![("country".into(), "US".into())],
            ..raw
        };
        let e = Event::validate(&raw, 1000, 3600).unwrap();
        assert_eq!(
            s.subtotals(&e.dims).unwrap_err().code(),
            ErrorCode::UnknownDimension
        );
    }

    #[test]
    fn a_compound_value_is_held_to_a_value_length() {
        let doc = SchemaDoc {
            tiers: vec!["1h:forever".into()],
            breakdown_tiers: None,
            dimensions: Some(vec!["a".into(), "b".into(), "a+b".into()]),
        };
        let s = Schema::from_doc(&doc).unwrap();
        let event = |a: &str, b: &str| {
            let raw = RawEvent {
                ns: "x".into(),
                key: "k".into(),
                dims: vec![("a".into(), a.into()), ("b".into(), b.into())],
                ..RawEvent::default()
            };
            Event::validate(&raw, 1000, 3600).unwrap()
        };
        // 1 023 + "|" + 1 024: exactly 2 048, the most a value holds.
        let fits = event(&"x".repeat(1023), &"y".repeat(1024));
        let subs = s.subtotals(&fits.dims).unwrap();
        assert_eq!(subs[2].value.len(), MAX_DIM_VALUE_BYTES);
        // One byte more, or a part that escaping lengthens past it: refused, with the
        // compound named; each part alone is a valid value.
        for (a, b) in [
            ("x".repeat(1024), "y".repeat(1024)),
            ("|".repeat(1024), "y".to_owned()),
        ] {
            let e = s.subtotals(&event(&a, &b).dims).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidDimension);
            assert!(
                e.to_string().contains("compound a+b") && e.to_string().contains("2048 bytes"),
                "{e}"
            );
        }
    }
}
