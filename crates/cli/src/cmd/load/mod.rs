//! `tally load FILE… | -`: bulk-load events from CSV or NDJSON files (plain, `.gz`, `.zst`).
//!
//! Every line is checked by the rules the API applies (the event rules, and the namespaces'
//! allow-lists as the target holds them): a bad line stops the load naming its file, line
//! and reason **before anything is applied** (`--skip-bad` counts and skips bad lines
//! instead). Then:
//! - `--server URL` (this module): a check pass — each line here, then each batch by the
//!   server itself as a dry run (`POST /v1/events?dry_run=true`), since only the server knows
//!   its config, the token's scopes (a write-only token reads no schema) and its clock — then
//!   the same batches for real, `POST /v1/events` (NDJSON), each with an `Idempotency-Key`,
//!   so a load that was interrupted and run again counts every event exactly once (within
//!   the server's 24 h memory of keys); unavailable servers and keys in flight are retried
//!   with backoff. In both passes a thread of its own sends the requests, in order, so the
//!   server's work on a batch overlaps reading and checking the next. A rebuild sends the events aggregated in one `POST /v1/ns/{ns}/rebuild`
//!   (applied whole or not at all, so it has no dry run).
//! - `--data DIR` (a stopped server's directory, or a new one with `--create`: `fresh`;
//!   `offline`): counters aggregated in memory
//!   within `--memory-mb` and written straight into archive segments (`Engine::install`: no
//!   log, no memtable) — in one pass when they fit, else two — each install published
//!   atomically with the idempotency answers of its batches, so a re-run within 24 h (how
//!   long answers are kept) skips what was installed. With `--config` (`TALLY_CONFIG`), the
//!   lines are checked by the server's `[defaults]`, `[limits] max_future_secs` and
//!   `[namespaces]`, as the server would check them.
//!
//! The keys are made of the file's bytes and name (its path's last part, not the path as
//! typed: `a.csv`, `./a.csv` and `/data/a.csv` are one file; stdin: its bytes alone),
//! `--batch` and the batch's first line: a re-run counts once only with the same files and
//! the same `--batch`. (A batch also ends early at `load::MAX_BATCH_BYTES` of lines.) A
//! file given twice in one run counts once (online the server replays the second copy's
//! batches; offline they are skipped).
//!
//! stdin (`-`) is copied to a temporary file first, as it may be read twice.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};
use tally_core::ingest::{self, Defaults, IngestError, Limits};
use tally_core::model::{Namespace, RawEvent, Schema, SchemaDoc};
use tally_core::reference::MemStore;
use tally_core::store::{Batch, Clock, Store, SystemClock};
use tally_engine::{Config, Engine};

use crate::conn::write_json;
use crate::http::{Client, Route};
use crate::load::{Digest, Format, Input, spool_stdin};

mod fresh;
mod offline;

use fresh::Fresh;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["data", "server"])))]
pub struct LoadArgs {
    /// Files of events (`-` for stdin): CSV (header ns,key,ts,n,<dimensions>…) or NDJSON,
    /// plain, .gz or .zst.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The format, when the file names do not tell (.csv, .ndjson, .jsonl).
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// Load into this running server.
    #[arg(long, value_parser = crate::http::server_url)]
    server: Option<String>,
    /// Bearer token for --server (needs write on the namespaces).
    #[arg(
        long,
        env = "TALLY_TOKEN",
        hide_env_values = true,
        requires = "server",
        value_parser = crate::http::token
    )]
    token: Option<String>,
    /// Load into a stopped server's data directory (the one `tally serve --data` uses; a path
    /// that is not a data directory is refused, unless --create).
    #[arg(long)]
    data: Option<PathBuf>,
    /// With --data: make a new data directory there (parent directories included) if the path
    /// is not one yet; nothing else may be there. A refused load takes away what it made.
    #[arg(long, requires = "data", conflicts_with = "replace")]
    create: bool,
    /// With --data: the server's configuration file (as `tally serve --config` takes it), so
    /// the load applies its [defaults], [limits] max_future_secs and max_namespaces and
    /// [namespaces] as the server would. Through --server, the server applies its own (a warning says so).
    #[arg(long, env = "TALLY_CONFIG")]
    config: Option<PathBuf>,
    /// Events per batch.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch: u32,
    /// With --data: memory for counters aggregated before they are written as segments
    /// (16 to 1048576).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    memory_mb: u32,
    /// Rebuild: replace what --ns holds in [--from, --to) — whole hours, closed — with what
    /// the files say, atomically; every event must fall inside. With --server, in one request
    /// (POST /v1/ns/{ns}/rebuild, an admin token); with --data, in one install.
    #[arg(long, requires_all = ["ns", "from", "to"])]
    replace: bool,
    /// With --replace: the namespace rebuilt.
    #[arg(long, requires = "replace")]
    ns: Option<String>,
    /// With --replace: the range's start (unix seconds or RFC 3339; a whole hour).
    #[arg(long, requires = "replace")]
    from: Option<String>,
    /// With --replace: the range's end, exclusive (a whole hour).
    #[arg(long, requires = "replace")]
    to: Option<String>,
    /// Count and skip bad lines instead of refusing the load. Not with --replace: a rebuild
    /// replaces its range with what the files say, so a line left out would be lost.
    #[arg(long, conflicts_with = "replace")]
    skip_bad: bool,
    /// Count the input again even if a load of the same bytes counted it within 24 hours
    /// (a recurring file of events without `ts`, each meaning "now"): its batches get keys
    /// of this run alone, so this load, if interrupted, cannot be run again exactly once.
    #[arg(long)]
    again: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Print the summary as JSON on stdout (instead of a line on stderr).
    #[arg(long)]
    json: bool,
}

/// One input: where its bytes are, the name it is shown by, its digest.
struct Source {
    path: PathBuf,
    name: String,
    /// The last part of its path (`None` for stdin): what its digest names it by.
    file_name: Option<String>,
    /// Of the bytes and the file name: two files with the same bytes under different names
    /// are two loads; one file reached by different paths is one.
    digest: u64,
    /// An earlier input of this run has the same digest, so the same batches and keys.
    repeat: bool,
    bytes: u64,
}

/// Where the batches go.
enum Target {
    Server(Client),
    Engine(Box<Engine>),
}

/// Checks events by the API's rules against the target's schemas (namespaces created on the
/// way are remembered, counts are not).
struct Checker {
    schemas: MemStore,
    limits: Limits,
    defaults: Defaults,
    now: i64,
}

/// The server's rules a load follows: its `[limits]`, `[defaults]` and `[namespaces]`.
struct Rules {
    limits: Limits,
    defaults: Defaults,
    /// Declared in the config: a server creates (or changes) them when it starts.
    namespaces: Vec<(Namespace, Schema)>,
}

impl Rules {
    /// With --data, those of the config file (`--config`, `TALLY_CONFIG`), else the defaults.
    fn of(a: &LoadArgs) -> anyhow::Result<Rules> {
        let (Some(path), None) = (&a.config, &a.server) else {
            return Ok(Rules {
                limits: Limits::default(),
                defaults: Defaults::default(),
                namespaces: Vec::new(),
            });
        };
        let text = tally_server::read_settings_file(path)
            .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
            .with_context(|| format!("reading config {}", path.display()))?;
        let s = tally_server::Settings::from_toml(&text)
            .with_context(|| format!("config {}", path.display()))?;
        Ok(Rules {
            limits: s.limits,
            defaults: s.defaults,
            namespaces: s.namespaces,
        })
    }
}

impl Checker {
    /// A checker of the target's namespaces and the config's: a namespace the config declares
    /// and the target lacks is known as the config says (a server would create it at start,
    /// and the load creates it when it uses it).
    fn of(target: &Target, limits: Limits, rules: &Rules, now: i64) -> anyhow::Result<Checker> {
        let checker = Checker {
            schemas: MemStore::new(std::sync::Arc::new(SystemClock)),
            limits,
            defaults: rules.defaults.clone(),
            now,
        };
        for (ns, schema) in schemas_of(target)? {
            checker
                .schemas
                .put_schema(&ns, &schema)
                .map_err(|e| anyhow::anyhow!(e.detail()))?;
        }
        for (ns, schema) in &rules.namespaces {
            match checker.schemas.schema(ns) {
                Ok(Some(held)) if held.declares_same(schema) => {}
                // The server changes it when it starts; the load cannot say how that goes
                // with what the directory holds, so it leaves that to the server.
                Ok(Some(_)) => bail!(
                    "namespace {ns}: the config's schema is not the one the data directory \
                     holds; start the server once with this config (it applies its \
                     [namespaces]), stop it, then load"
                ),
                Ok(None) => checker
                    .schemas
                    .put_schema(ns, schema)
                    .map_err(|e| anyhow::anyhow!(e.detail()))?,
                Err(e) => bail!("checking namespace {ns}: {}", e.detail()),
            }
        }
        Ok(checker)
    }

    /// Checks `events`, taking out the bad ones (reported through `bad` with their line) until
    /// the rest make one batch.
    fn batch(
        &self,
        events: &mut Vec<(u64, RawEvent)>,
        bad: &mut dyn FnMut(u64, String) -> anyhow::Result<()>,
    ) -> anyhow::Result<Batch> {
        let raws = events.iter().map(|(_, e)| e.clone()).collect();
        match ingest::prepare_owned(&self.schemas, raws, self.now, &self.limits, &self.defaults) {
            Ok(b) => return self.created(b),
            Err(IngestError::Store(e)) => bail!("checking a batch: {}", e.detail()),
            Err(_) => {}
        }
        // Some line is bad: check each alone (one pass, however many are bad), then the rest
        // together.
        let mut good = Vec::with_capacity(events.len());
        for (line, e) in events.drain(..) {
            match self.one(e.clone())? {
                Ok(_) => good.push((line, e)),
                Err(why) => bad(line, why)?,
            }
        }
        *events = good;
        let raws = events.iter().map(|(_, e)| e.clone()).collect();
        match ingest::prepare_owned(&self.schemas, raws, self.now, &self.limits, &self.defaults) {
            Ok(b) => self.created(b),
            Err(e) => bail!("checking a batch: {e}"),
        }
    }

    /// Checks one event: its batch, or why it is refused.
    fn one(&self, raw: RawEvent) -> anyhow::Result<Result<Batch, String>> {
        match ingest::prepare_owned(
            &self.schemas,
            vec![raw],
            self.now,
            &self.limits,
            &self.defaults,
        ) {
            Ok(b) => Ok(Ok(self.created(b)?)),
            Err(IngestError::Store(e)) => bail!("checking an event: {}", e.detail()),
            Err(e) => Ok(Err(reason(e))),
        }
    }

    /// Remembers the namespaces `b` creates (their schemas, not counts).
    fn created(&self, b: Batch) -> anyhow::Result<Batch> {
        for (ns, schema) in &b.create {
            self.schemas
                .put_schema(ns, schema)
                .map_err(|e| anyhow::anyhow!(e.detail()))?;
        }
        Ok(b)
    }
}

/// Why one event was refused, without the batch's "event N:" prefix.
fn reason(e: IngestError) -> String {
    match e {
        IngestError::Event { source, .. } => source.to_string(),
        IngestError::UnknownNamespace { ns, .. } => {
            format!("namespace {ns} does not exist (auto_create is off)")
        }
        IngestError::TooManyNamespaces { ns, max, .. } => ingest::too_many_namespaces(&ns, max),
        other => other.to_string(),
    }
}

pub fn run(a: LoadArgs) -> anyhow::Result<()> {
    let mut fresh = None;
    let done = load(a, &mut fresh);
    // Taken away only while it holds nothing published: once an install has published a
    // manifest, what it holds is loaded (a failure after it, printing the summary say,
    // must not delete a finished load), and running the command again resumes.
    let published = |f: &Fresh| f.dir.join(tally_engine::manifest::CURRENT).exists();
    if let (Err(_), Some(fresh)) = (&done, fresh.filter(|f| !published(f))) {
        let dir = fresh.dir.clone();
        if let Err(e) = fresh.undo() {
            eprintln!(
                "tally: warning: could not take away the data directory this load made at {}: {e}",
                dir.display()
            );
        }
    }
    done
}

/// The load; `fresh`: the data directory it made (--create), which a refused load takes
/// away (once the engine is closed: when this returns).
fn load(a: LoadArgs, fresh: &mut Option<Fresh>) -> anyhow::Result<()> {
    if let (Some(config), Some(_)) = (&a.config, &a.server) {
        eprintln!(
            "tally: warning: --config (or TALLY_CONFIG) is not used with --server: the server \
             checks every batch by its own configuration ({} ignored)",
            config.display()
        );
    }
    let rules = Rules::of(&a)?;
    // stdin's copy, held until the load ends (see `spool_stdin`).
    let mut spooled = None;
    let mut sources = Vec::new();
    for f in &a.files {
        let (path, name, file_name) = if f.as_os_str() == "-" {
            if a.format.is_none() {
                bail!("stdin (-) needs --format csv or --format ndjson");
            }
            if spooled.is_some() {
                bail!("stdin (-) is given more than once: it can be read only once");
            }
            let (file, path) = spool_stdin()?;
            spooled = Some(file);
            (path, "stdin".to_owned(), None)
        } else {
            let file_name = f.file_name().map(|n| n.to_string_lossy().into_owned());
            (f.clone(), f.display().to_string(), file_name)
        };
        let bytes = std::fs::metadata(&path)
            .with_context(|| format!("opening {name}"))?
            .len();
        sources.push(Source {
            path,
            name,
            file_name,
            digest: 0,
            repeat: false,
            bytes,
        });
    }
    let total: u64 = sources.iter().map(|s| s.bytes).sum();
    let target = match (&a.server, &a.data) {
        (Some(server), _) => Target::Server(Client::new(server, a.token.as_deref())),
        (None, Some(dir)) => Target::Engine(Box::new({
            // A rebuild replaces what a directory holds, and a plain load into a path that
            // is not a data directory most likely names a mistyped path: refused, unless
            // --create asks for a new one.
            if a.replace {
                crate::cmd::existing_data_dir(dir)?;
            } else {
                *fresh = Fresh::prepare(dir, a.create)?;
            }
            // The segments the load writes and reads keep their decoded dictionaries within
            // a sixteenth of --memory-mb (see `offline::run` for the rest of it).
            tally_engine::segment::dicts::set_budget(a.memory_mb as usize * (1 << 20) / 16);
            Engine::open(Config::new(dir))
                .with_context(|| format!("opening data directory {}", dir.display()))?
        })),
        (None, None) => bail!("give --server URL or --data DIR"),
    };
    let now = SystemClock.now();
    let rebuild = match (&a.replace, &a.ns, &a.from, &a.to) {
        (true, Some(ns), Some(from), Some(to)) => Some(Rebuild::parse(ns, from, to, now)?),
        _ => None,
    };
    // As a server answers (404): a rebuild replaces what a namespace holds, and must not
    // make one with the default tiers as a load would.
    if let (Target::Engine(engine), Some(r)) = (&target, &rebuild) {
        let known = tally_core::store::Store::schema(engine.as_ref(), &r.ns)
            .map_err(|e| anyhow::anyhow!("{}", e.detail()))?;
        if known.is_none() {
            bail!(
                "unknown_namespace: namespace {} does not exist; a rebuild replaces what a \
                 namespace holds (load without --replace to create it)",
                r.ns
            );
        }
    }
    // Through a server, the server checks every batch too (a dry run): it alone knows its
    // config, the token's scopes, the namespaces the token cannot read and its clock.
    let dry = match (&target, &rebuild) {
        // A rebuild is one request, applied whole or not at all: nothing to check first.
        (Target::Server(client), None) => DryRun::of(client, &a)?,
        _ => None,
    };
    let mut limits = Limits {
        max_batch_events: a.batch as usize,
        max_future_secs: rules.limits.max_future_secs,
        max_namespaces: rules.limits.max_namespaces,
        // A server holds its batches to its own; offline, `--memory-mb` bounds the work.
        max_batch_updates: usize::MAX,
        ..Limits::default()
    };
    if dry.is_some() {
        // The server judges timestamps by its own clock and max_future_secs; a local limit
        // could only refuse what it takes.
        limits.max_future_secs = i64::MAX;
    }
    if let Target::Server(_) = target {
        // Namespaces by its max_namespaces, and it counts those the token cannot list too.
        limits.max_namespaces = usize::MAX;
    }
    let checker = Checker::of(&target, limits, &rules, now)?;
    let start = Instant::now();
    let mut digests = HashSet::new();
    // With --again, what makes this run's keys its own.
    let run = a.again.then(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        format!("again {t} {}", std::process::id())
    });
    for s in &mut sources {
        let mut d = digest(&s.path).with_context(|| format!("reading {}", s.name))?;
        // Two files with the same bytes under different names are two loads; the path as
        // typed (`a.csv`, `./a.csv`, its absolute path, another working directory) is not
        // part of it, so one file is one load however it is reached.
        if let Some(file_name) = &s.file_name {
            d.update(b"\0");
            d.update(file_name.as_bytes());
        }
        if let Some(run) = &run {
            d.update(b"\0");
            d.update(run.as_bytes());
        }
        s.digest = d.value();
        s.repeat = !digests.insert(s.digest);
    }
    let client = match &target {
        Target::Engine(engine) => {
            return offline::run(
                &a,
                engine,
                &sources,
                &checker,
                rebuild.as_ref(),
                start,
                fresh.as_ref().map(|f| f.dir.as_path()),
            );
        }
        Target::Server(client) => client,
    };

    // Pass 1: every line checked, here and then by the server; nothing is applied.
    let bar = progress(a.quiet, total, "checking");
    let bad_lines = std::cell::Cell::new(0u64);
    // Chunks (by first line) where the check found a bad line: the second pass checks those
    // again line by line; the others it hands to the batch without a copy.
    let mut dirty: HashSet<u64> = HashSet::new();
    // Of each source, the lines the server refused (sorted), which the second pass drops: it
    // cannot find them again without asking the server again. Each cost a request at least.
    let mut refused: Vec<Vec<u64>> = vec![Vec::new(); sources.len()];
    let mut server_refused = 0u64;
    let mut shown = Vec::new();
    let mut events = 0u64;
    // The server's checks are sent by a thread of their own, in order, so reading and
    // checking the next batch here overlaps the server's check of this one; a batch the
    // server refuses something of is then checked again here, part by part
    // (`DryRun::check`). At most `AHEAD` batches wait for their answer.
    const AHEAD: usize = 2;
    let (probes, to_probe) = std::sync::mpsc::sync_channel::<Vec<u8>>(AHEAD);
    let (answers, answered) = std::sync::mpsc::channel::<anyhow::Result<Option<Refusal>>>();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        // Owned here, so that it closes (and the prober ends) when this closure returns,
        // before the scope waits for the prober.
        let probes = probes;
        if let Some(d) = &dry {
            scope.spawn(move || {
                for body in to_probe {
                    let answer = d.probe(&body);
                    let failed = answer.is_err();
                    if answers.send(answer).is_err() || failed {
                        break;
                    }
                }
            });
        }
        // The answer to the oldest batch sent; a closed queue: the prober stopped on an error.
        let next_answer = || -> anyhow::Result<Option<Refusal>> {
            answered
                .recv()
                .map_err(|_| anyhow::anyhow!("the thread checking batches stopped"))?
        };
        for (si, s) in sources.iter().enumerate() {
            let name = s.name.clone();
            let mut bad = |line: u64, why: String| -> anyhow::Result<()> {
                if !a.skip_bad {
                    bail!("{name}:{line}: {why}; nothing was loaded (--skip-bad skips bad lines)");
                }
                bad_lines.set(bad_lines.get() + 1);
                // The first five in file order (the server's refusals of a batch may come
                // after lines found bad here in the batches after it).
                if shown.len() < 5
                    || shown
                        .last()
                        .is_some_and(|l: &(usize, u64, String)| (l.0, l.1) > (si, line))
                {
                    shown.push((si, line, format!("{name}:{line}: {why}")));
                    shown.sort_by_key(|l| (l.0, l.1));
                    shown.truncate(5);
                }
                Ok(())
            };
            let batch = a.batch as usize;
            let mut waiting: std::collections::VecDeque<Vec<(u64, RawEvent)>> =
                std::collections::VecDeque::new();
            // A batch whose answer came: counted, or checked part by part if refused.
            let mut settle = |mut chunk: Vec<(u64, RawEvent)>,
                              refusal: Option<Refusal>,
                              bad: &mut BadLine<'_>|
             -> anyhow::Result<()> {
                if let (Some(refusal), Some(d)) = (refusal, &dry) {
                    server_refused +=
                        d.check(&s.name, &mut chunk, refusal, bad, &mut refused[si])?;
                }
                events += chunk.len() as u64;
                Ok(())
            };
            let server_stopped = std::cell::Cell::new(false);
            let fed = each_batch(s, a.format, &bar, batch, &mut bad, &mut |mut chunk, bad| {
                let first = chunk.first().map_or(0, |(l, _)| *l);
                let before = bad_lines.get();
                if let Some(r) = &rebuild {
                    let mut kept = Vec::with_capacity(chunk.len());
                    for (line, e) in chunk {
                        match r.refuses(&e) {
                            Some(why) => bad(line, why)?,
                            None => kept.push((line, e)),
                        }
                    }
                    chunk = kept;
                }
                checker.batch(&mut chunk, bad)?;
                if bad_lines.get() > before {
                    dirty.insert(first);
                }
                if dry.is_none() || chunk.is_empty() {
                    return settle(chunk, None, bad);
                }
                // From here on an error is the server's (or of a batch before this one).
                let sent = (|| -> anyhow::Result<()> {
                    if probes.send(ndjson(chunk.iter().map(|(_, e)| e))?).is_err() {
                        // The prober stopped: its error is among the answers.
                        loop {
                            next_answer()?;
                        }
                    }
                    waiting.push_back(chunk);
                    while waiting.len() > AHEAD {
                        let refusal = next_answer()?;
                        if let Some(chunk) = waiting.pop_front() {
                            settle(chunk, refusal, bad)?;
                        }
                    }
                    Ok(())
                })();
                server_stopped.set(sent.is_err());
                sent
            });
            // A load stopped by a bad line found here names the first bad line: the batches
            // still waiting for the server come before it in the file, and a line the server
            // refuses in one of them is the one (they settle in order; `bad` stops at the
            // first). A load the server's answers stopped, or one with --skip-bad (whose `bad`
            // stops nothing), stops with its own error.
            if fed.is_err() && (a.skip_bad || server_stopped.get()) {
                return fed;
            }
            while let Some(chunk) = waiting.pop_front() {
                let refusal = next_answer()?;
                settle(chunk, refusal, &mut bad)?;
            }
            fed?;
            refused[si].sort_unstable();
        }
        Ok(())
    })?;
    bar.finish_and_clear();
    if events == 0 && rebuild.is_none() {
        let shown: Vec<&String> = shown.iter().map(|(_, _, s)| s).collect();
        if a.json {
            json_summary(
                0,
                sources.len(),
                start.elapsed().as_secs_f64(),
                json!({
                    "checking_seconds": start.elapsed().as_secs_f64(),
                    "loaded_before": 0,
                    "skipped": bad_lines.get(),
                    "refused_by_server": server_refused,
                    "skipped_lines": shown,
                }),
            )?;
        }
        return Err(no_events(bad_lines.get(), server_refused, &shown));
    }
    let checked = start.elapsed().as_secs_f64();

    // Pass 2: the batches applied, checked again against the target's own schemas (so a
    // namespace created on the way is created by its first batch).
    let checker = Checker::of(&target, limits, &rules, now)?;
    let bar = progress(a.quiet, total, "loading");
    let mut loaded = 0u64;
    let mut already = 0u64;
    // A rebuild through a server: its events aggregated, by (key, bucket, dimensions).
    type Aggregated = BTreeMap<(String, i64, Vec<(String, String)>), i64>;
    let mut rebuilt: Aggregated = BTreeMap::new();
    // The batches are posted in order by a thread of their own, so reading, checking and
    // encoding the next batch overlaps the server's work on this one (each waited for the
    // other: the load ran at the sum of their times). Two batches wait at most.
    let (posts, queued) = std::sync::mpsc::sync_channel::<Post>(2);
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let shown = bar.clone();
        let poster = scope.spawn(move || -> anyhow::Result<u64> {
            let (mut already, mut posted) = (0, 0u64);
            // The lines of the batches the server has taken, by file.
            let mut taken = Taken::default();
            for p in queued {
                let replayed = match send_batch(client, &p.body, &p.key) {
                    Ok(replayed) => replayed,
                    Err(e) => return Err(taken.stopped(&p, e)),
                };
                taken.add(&p);
                if replayed {
                    already += p.events;
                }
                // What the server has taken, not what waits in the queue.
                posted += p.events;
                shown.set_message(format!("loading, {posted} events"));
            }
            Ok(already)
        });
        let posts = posts;
        let fed = (|| -> anyhow::Result<()> {
            for (si, s) in sources.iter().enumerate() {
                let batch = a.batch as usize;
                let gone = &refused[si];
                each_batch(
                    s,
                    a.format,
                    &bar,
                    batch,
                    &mut |_, _| Ok(()),
                    &mut |mut chunk, _| {
                        let first = chunk.first().map_or(0, |(l, _)| *l);
                        let last = chunk.last().map_or(0, |(l, _)| *l);
                        let key = format!("tally-load-{:016x}-{}-{first}", s.digest, a.batch);
                        if let Some(r) = &rebuild {
                            chunk.retain(|(_, e)| r.refuses(e).is_none());
                        }
                        if !gone.is_empty() {
                            chunk.retain(|(line, _)| gone.binary_search(line).is_err());
                        }
                        // A clean chunk needs no second check; the others are checked line by line.
                        if dirty.contains(&first) {
                            checker.batch(&mut chunk, &mut |_, _| Ok(()))?;
                        }
                        let n = chunk.len() as u64;
                        if let Some(r) = &rebuild {
                            // Sent in one request at the end, aggregated: events of one key, dimensions
                            // and bucket count as one — a bucket every tier's buckets are made of (the
                            // greatest common divisor of the resolutions: 20-minute buckets do not
                            // make 30-minute ones, 10-minute ones make both).
                            let unit = checker
                                .schemas
                                .schema(&r.ns)
                                .ok()
                                .flatten()
                                .map(|s| {
                                    s.tiers()
                                        .iter()
                                        .map(|t| t.resolution.secs_i64())
                                        .fold(0, tally_core::tier::gcd)
                                })
                                .filter(|&u| u > 0)
                                .unwrap_or(1);
                            for (_, e) in &chunk {
                                let ts = e.ts.unwrap_or(now);
                                let mut dims = e.dims.clone();
                                dims.sort();
                                *rebuilt
                                    .entry((e.key.clone(), ts.div_euclid(unit) * unit, dims))
                                    .or_insert(0) += e.n.unwrap_or(1);
                            }
                            loaded += n;
                            return Ok(());
                        }
                        let post = Post {
                            body: ndjson(chunk.iter().map(|(_, e)| e))?,
                            key,
                            name: s.name.clone(),
                            first,
                            last,
                            events: n,
                        };
                        // A closed queue: the poster stopped on an error, which it answers below.
                        posts
                            .send(post)
                            .map_err(|_| anyhow::anyhow!("the load stopped"))?;
                        loaded += n;
                        Ok(())
                    },
                )?;
            }
            Ok(())
        })();
        drop(posts);
        let posted = poster
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the thread posting batches panicked")));
        // The poster's error first: the feed only saw the queue close.
        already = posted?;
        fed
    })?;
    bar.finish_and_clear();
    if let Some(r) = &rebuild {
        let mut body = Vec::with_capacity(rebuilt.len() * 96);
        for ((key, ts, dims), n) in &rebuilt {
            let mut o = Map::new();
            o.insert("ns".into(), json!(r.ns.as_str()));
            o.insert("key".into(), json!(key));
            o.insert("ts".into(), json!(ts));
            o.insert("n".into(), json!(n));
            if !dims.is_empty() {
                let d: Map<String, Value> =
                    dims.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                o.insert("dims".into(), Value::Object(d));
            }
            serde_json::to_writer(&mut body, &Value::Object(o))?;
            body.push(b'\n');
        }
        let route = Route::namespace(r.ns.as_str(), "rebuild")
            .param("from", r.from)
            .param("to", r.to);
        let (status, text, _) = client.post_body(&route, "application/x-ndjson", &body, &[])?;
        if status != 200 {
            let json: Value = serde_json::from_str(&text).unwrap_or_default();
            let e = crate::http::ServerError::new(status, json);
            if status == 413 {
                return Err(anyhow::anyhow!(e)).context(format!(
                    "the rebuild's {} aggregated events do not fit one request (the server's \
                     [limits] max_body_bytes / max_batch_events): rebuild a shorter range, or \
                     offline with --data",
                    rebuilt.len()
                ));
            }
            if status == 422 && text.contains("too_many_points") {
                return Err(anyhow::anyhow!(e)).context(
                    "what the range holds does not fit the server's rebuild memory (1 GiB): \
                     rebuild a shorter range, or offline with --data and --memory-mb",
                );
            }
            return Err(e.into());
        }
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        if a.json {
            return write_json(&json!({
                "replaced": {"ns": r.ns.as_str(), "from": r.from, "to": r.to},
                "loaded": loaded,
                "sent": rebuilt.len(),
                "seconds": start.elapsed().as_secs_f64(),
                "held_before": v["held_before"],
            }));
        }
        eprintln!(
            "replaced [{}, {}) of namespace {} with {loaded} events ({} sent aggregated) in {:.1} s ({} counters held before)",
            r.from,
            r.to,
            r.ns,
            rebuilt.len(),
            start.elapsed().as_secs_f64(),
            v["held_before"]
        );
        return Ok(());
    }
    let secs = start.elapsed().as_secs_f64();
    if a.json {
        return json_summary(
            loaded,
            sources.len(),
            secs,
            json!({
            "checking_seconds": checked,
            "loaded_before": already,
            "skipped": bad_lines.get(),
            "refused_by_server": server_refused,
            "skipped_lines": shown.iter().map(|(_, _, s)| s).collect::<Vec<_>>(),
            }),
        );
    }
    eprintln!(
        "loaded {loaded} events from {} file(s) in {secs:.1} s ({:.0} events/s; {checked:.1} s \
         of it checking){}{}",
        sources.len(),
        loaded as f64 / secs.max(1e-9),
        if already > 0 {
            format!(
                "; {already} of them were loaded before (the same file's batches count once \
                 in 24 hours; --again counts them again)"
            )
        } else {
            String::new()
        },
        skipped(bad_lines.get(), server_refused)
    );
    for (_, _, s) in shown {
        eprintln!("  skipped {s}");
    }
    Ok(())
}

/// The summary's account of bad lines skipped (`by_server` of them refused by the server),
/// after "; ".
fn skipped(bad: u64, by_server: u64) -> String {
    match (bad, by_server) {
        (0, _) => String::new(),
        (n, 0) => format!("; skipped {n} bad line(s)"),
        (n, by_server) => {
            format!("; skipped {n} bad line(s), {by_server} of them refused by the server")
        }
    }
}

/// A load with no event to load is refused; when every line was skipped as bad, it says how
/// many and the first reasons, as the summary would.
fn no_events(bad: u64, by_server: u64, shown: &[impl std::fmt::Display]) -> anyhow::Error {
    let skipped = skipped(bad, by_server);
    let mut m = match skipped.strip_prefix("; ") {
        Some(s) => format!("no events to load: {s}"),
        None => "no events to load".to_owned(),
    };
    for s in shown {
        m.push_str(&format!("\n  skipped {s}"));
    }
    anyhow::anyhow!(m)
}

/// A load's summary as `--json` prints it: what both modes report, then `more` (each
/// mode's own figures).
fn json_summary(loaded: u64, files: usize, secs: f64, more: Value) -> anyhow::Result<()> {
    let mut v = json!({
        "loaded": loaded,
        "files": files,
        "seconds": secs,
        "events_per_sec": loaded as f64 / secs.max(1e-9),
    });
    if let (Value::Object(v), Value::Object(more)) = (&mut v, more) {
        v.extend(more);
    }
    write_json(&v)
}

/// A rebuild's range: what it replaces, and which events belong to it.
struct Rebuild {
    ns: Namespace,
    from: i64,
    to: i64,
}

impl Rebuild {
    fn parse(ns: &str, from: &str, to: &str, now: i64) -> anyhow::Result<Rebuild> {
        let ns = Namespace::new(ns).map_err(|e| anyhow::anyhow!("--ns: {e}"))?;
        let at = |what: &str, t: &str| {
            tally_core::model::parse_instant(t).map_err(|e| anyhow::anyhow!("--{what}: {e}"))
        };
        let ((from, from_nanos), (to, to_nanos)) = (at("from", from)?, at("to", to)?);
        if from % 3600 != 0 || to % 3600 != 0 || from_nanos != 0 || to_nanos != 0 {
            bail!(
                "--from and --to of a rebuild are whole hours (every tier's buckets then lie wholly inside or outside)"
            );
        }
        if from >= to {
            bail!("--from ({from}) must be before --to ({to})");
        }
        if to > now {
            bail!("a rebuild replaces a closed range: --to ({to}) is in the future");
        }
        Ok(Rebuild { ns, from, to })
    }

    /// Why an event does not belong to the rebuild, if it does not.
    fn refuses(&self, e: &RawEvent) -> Option<String> {
        if e.ns != self.ns.as_str() {
            return Some(format!(
                "namespace {:?} is not the rebuilt one ({})",
                e.ns, self.ns
            ));
        }
        let Some(ts) = e.ts else {
            return Some(format!(
                "it has no ts: a rebuild's events need one, inside the rebuilt range [{}, {}) \
                 (without one an event is dated now, after the range)",
                self.from, self.to
            ));
        };
        (ts < self.from || ts >= self.to).then(|| {
            format!(
                "ts {ts} is outside the rebuilt range [{}, {})",
                self.from, self.to
            )
        })
    }
}

/// What to do with a bad line: (line number, why).
type BadLine<'a> = dyn FnMut(u64, String) -> anyhow::Result<()> + 'a;

/// What to do with a chunk of good lines (it may still find bad ones: they go to the second
/// argument).
type OnChunk<'a> = dyn FnMut(Vec<(u64, RawEvent)>, &mut BadLine<'_>) -> anyhow::Result<()> + 'a;

/// Reads `s`'s events in chunks of `batch` lines, handing each chunk to `f`; bad lines go to
/// `bad`.
fn each_batch(
    s: &Source,
    format: Option<Format>,
    bar: &indicatif::ProgressBar,
    batch: usize,
    bad: &mut BadLine<'_>,
    f: &mut OnChunk<'_>,
) -> anyhow::Result<()> {
    /// What the reading thread hands over: `batch` lines, or why it stopped.
    enum Read {
        Lines(Vec<(u64, Result<RawEvent, String>)>),
        Failed(anyhow::Error),
    }
    let input = Input::open(&s.path, &s.name, format, bar)?;
    // Reading and parsing on one core, checking and applying on the other; two chunks in
    // flight bound the memory.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Read>(2);
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::with_capacity(batch);
        let mut bytes = 0;
        let read = input.events(&mut |line, weight, e| {
            bytes += weight;
            lines.push((line, e));
            if lines.len() >= batch || bytes >= crate::load::MAX_BATCH_BYTES {
                bytes = 0;
                tx.send(Read::Lines(std::mem::take(&mut lines)))
                    .map_err(|_| anyhow::anyhow!("the load stopped"))?;
            }
            Ok(())
        });
        let _ = match read {
            Ok(()) if lines.is_empty() => Ok(()),
            Ok(()) => tx.send(Read::Lines(lines)),
            Err(e) => tx.send(Read::Failed(e)),
        };
    });
    for read in rx {
        match read {
            Read::Lines(lines) => {
                let mut chunk = Vec::with_capacity(lines.len());
                for (line, e) in lines {
                    match e {
                        Ok(e) => chunk.push((line, e)),
                        Err(why) => bad(line, why)?,
                    }
                }
                if !chunk.is_empty() {
                    f(chunk, bad)?;
                }
            }
            Read::Failed(e) => return Err(e),
        }
    }
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reading thread failed"))?;
    Ok(())
}

/// The target's namespaces and schemas, to check events against.
fn schemas_of(target: &Target) -> anyhow::Result<Vec<(Namespace, Schema)>> {
    match target {
        Target::Engine(e) => e.namespaces().map_err(|e| anyhow::anyhow!(e.detail())),
        Target::Server(client) => {
            let answer = client.get::<Value>(&Route::fixed("/v1/ns"))?;
            let mut out = Vec::new();
            for n in answer.json()["namespaces"].as_array().into_iter().flatten() {
                let name = n["name"].as_str().unwrap_or_default();
                let mut fields = n.clone();
                if let Some(o) = fields.as_object_mut() {
                    o.remove("name");
                }
                let doc: SchemaDoc = serde_json::from_value(fields)
                    .with_context(|| format!("the server's schema of {name}"))?;
                let ns = Namespace::new(name).map_err(|e| anyhow::anyhow!("{e}"))?;
                let schema = Schema::from_doc(&doc).map_err(|e| anyhow::anyhow!("{e}"))?;
                out.push((ns, schema));
            }
            Ok(out)
        }
    }
}

/// The digest of a file's bytes.
fn digest(path: &std::path::Path) -> std::io::Result<Digest> {
    use std::io::Read;
    let mut d = Digest::default();
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(d);
        }
        d.update(buf.get(..n).unwrap_or_default());
    }
}

/// The events as an NDJSON body of `POST /v1/events`.
fn ndjson<'e>(events: impl Iterator<Item = &'e RawEvent>) -> anyhow::Result<Vec<u8>> {
    use std::io::Write;
    // Written field by field: building a JSON value per event first took a third of the
    // load's time in allocation. The bytes are exactly the value's (`preserve_order`:
    // fields in insertion order), which matters: a batch's Idempotency-Key is bound to its
    // bytes, so a load interrupted by an older `tally` resumes with this one.
    let mut body = Vec::new();
    for e in events {
        body.extend_from_slice(b"{\"ns\":");
        serde_json::to_writer(&mut body, &e.ns)?;
        body.extend_from_slice(b",\"key\":");
        serde_json::to_writer(&mut body, &e.key)?;
        if let Some(ts) = e.ts {
            write!(body, ",\"ts\":{ts}")?;
        }
        if let Some(n) = e.n {
            write!(body, ",\"n\":{n}")?;
        }
        if !e.dims.is_empty() {
            body.extend_from_slice(b",\"dims\":{");
            // A name given twice keeps its first place and its last value, as a map would.
            let mut first = true;
            for (i, (k, _)) in e.dims.iter().enumerate() {
                if e.dims[..i].iter().any(|(seen, _)| seen == k) {
                    continue;
                }
                let v = e.dims[i..]
                    .iter()
                    .rev()
                    .find(|(n, _)| n == k)
                    .map_or("", |d| &d.1);
                if !first {
                    body.push(b',');
                }
                first = false;
                serde_json::to_writer(&mut body, k)?;
                body.push(b':');
                serde_json::to_writer(&mut body, v)?;
            }
            body.push(b'}');
        }
        body.extend_from_slice(b"}\n");
    }
    Ok(body)
}

/// One batch for the poster: its NDJSON, its Idempotency-Key, and where it comes from.
struct Post {
    body: Vec<u8>,
    key: String,
    name: String,
    first: u64,
    last: u64,
    events: u64,
}

/// The lines of the batches the server has taken, by file (first and last line): what a
/// load stopped midway says it loaded before it stopped.
#[derive(Debug, Default)]
struct Taken(Vec<(String, u64, u64)>);

impl Taken {
    fn add(&mut self, p: &Post) {
        match self.0.last_mut() {
            // The next batch of the same file (a file given twice starts again).
            Some((name, _, last)) if *name == p.name && p.first > *last => *last = p.last,
            _ => self.0.push((p.name.clone(), p.first, p.last)),
        }
    }

    /// The error of a load stopped at batch `p` by `cause`: it names the batch, what was
    /// loaded before it and, when the server refused the batch, that the same command run
    /// again loads the rest (the batches' keys count each once).
    fn stopped(&self, p: &Post, cause: anyhow::Error) -> anyhow::Error {
        let refused = cause
            .downcast_ref::<crate::http::ServerError>()
            .is_some_and(|e| e.code != "idempotency_key_reused");
        let before = match self.0.as_slice() {
            [] => "nothing was loaded before it".to_owned(),
            taken => {
                let lines: Vec<String> = taken
                    .iter()
                    .map(|(name, first, last)| format!("{name} lines {first}–{last}"))
                    .collect();
                format!("loaded before it: {}", lines.join(", "))
            }
        };
        let resume = if refused {
            "; once the cause is fixed, run the same command again to resume (loaded batches \
             are not counted twice within 24 hours)"
        } else {
            ""
        };
        anyhow::Error::new(Stopped {
            batch: format!("{}: lines {}–{}", p.name, p.first, p.last),
            cause,
            then: format!("{before}{resume}"),
        })
    }
}

/// A load stopped midway: the batch, its cause, then what was loaded before it and how to go
/// on — the cause written in the middle, not after as a context's would be, so that the
/// message ends with what to do.
#[derive(Debug)]
struct Stopped {
    batch: String,
    cause: anyhow::Error,
    then: String,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {:#}; {}", self.batch, self.cause, self.then)
    }
}

impl std::error::Error for Stopped {}

/// POSTs one batch's NDJSON under `key`. Answers whether the server had applied it before
/// (a re-run).
fn send_batch(client: &Client, body: &[u8], key: &str) -> anyhow::Result<bool> {
    let route = Route::fixed("/v1/events");
    match send(client, &route, body, &[("Idempotency-Key", key)])? {
        (200, _, replayed) => Ok(replayed),
        (422, text, _) if text.contains("idempotency_key_reused") => {
            Err(anyhow::anyhow!(server_error(422, &text)).context(
                "a load of the same file within 24 hours counted these lines another way. \
                 Either it was an offline load into the server's data directory (tally load \
                 --data), and the lines are counted; or it counted a different set of them \
                 with the same --batch: a line's verdict changed since (a timestamp then in \
                 the future, a limit or a schema), or --skip-bad was not given then. What \
                 that load counted stays counted; --again counts the file again",
            ))
        }
        (status, text, _) => Err(server_error(status, &text).into()),
    }
}

/// An error answer's status and text as an error.
fn server_error(status: u16, text: &str) -> crate::http::ServerError {
    let json: Value = serde_json::from_str(text).unwrap_or_default();
    crate::http::ServerError::new(status, json)
}

/// POSTs an NDJSON `body` to `route`, retrying what may pass later: no connection, 503, and
/// 409 (the same key still in flight from an earlier attempt). Answers the final status,
/// text, and whether the server replayed a remembered answer.
fn send(
    client: &Client,
    route: &Route,
    body: &[u8],
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String, bool)> {
    let mut wait = Duration::from_millis(100);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sent = client.post_body(route, "application/x-ndjson", body, headers);
        if let Ok((status, _, _)) = &sent
            && !matches!(status, 409 | 503)
        {
            return sent;
        }
        if Instant::now() + wait > deadline {
            return match sent {
                Ok((status, text, _)) => bail!(
                    "the server still answers {status} after 2 minutes of retries: {text}; run the \
                     same command again to resume (loaded batches are not counted twice within 24 hours)"
                ),
                Err(e) => Err(e.context(
                    "the server is unreachable after 2 minutes of retries; run the same command \
                     again to resume (loaded batches are not counted twice within 24 hours)",
                )),
            };
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

/// The server's own check of each batch, `POST /v1/events?dry_run=true`: what the server
/// would refuse by its config (`[defaults]`, `[limits]`, `[namespaces]`), the token's scopes
/// (a write-only token reads no schema, so the local check cannot see allow-lists) and its
/// clock — none of which the local check knows.
struct DryRun<'a> {
    client: &'a Client,
    batch: u32,
    skip_bad: bool,
}

/// A dry run's refusal as the server answered it: status and body.
struct Refusal {
    status: u16,
    text: String,
}

/// What the server says of one dry run.
enum Verdict {
    Accepted,
    /// The event at this index of the body (0-based) is refused, for this reason.
    Refused(usize, String),
}

impl<'a> DryRun<'a> {
    /// The server's check, if it has dry runs: a dry run of no events answers
    /// `"dry_run": true`. A server older than dry runs ignores the parameter and answers
    /// `{"accepted": 0}` for the empty batch, applying nothing; then lines are checked here
    /// only, as before, and the load says so.
    fn of(client: &'a Client, a: &LoadArgs) -> anyhow::Result<Option<DryRun<'a>>> {
        // Not retried: a wrong address fails at once, as every first request of a command.
        let (status, text, _) =
            client.post_body(&Self::route(), "application/x-ndjson", b"", &[])?;
        if status != 200 {
            return Err(anyhow::anyhow!(server_error(status, &text)))
                .context("asking the server to check a batch");
        }
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        if v["dry_run"] != json!(true) {
            eprintln!(
                "tally: warning: this server cannot check a batch without applying it (it is \
                 older than POST /v1/events?dry_run=true): lines are checked here only, and a \
                 line the server refuses stops the load after the batches before it"
            );
            return Ok(None);
        }
        Ok(Some(DryRun {
            client,
            batch: a.batch,
            skip_bad: a.skip_bad,
        }))
    }

    fn route() -> Route {
        Route::fixed("/v1/events").param("dry_run", "true")
    }

    /// The server's dry run of a batch (its NDJSON): `None` if it accepts all of it, else
    /// its answer, which [`DryRun::check`] takes as the first verdict on the whole batch.
    fn probe(&self, body: &[u8]) -> anyhow::Result<Option<Refusal>> {
        let (status, text, _) = send(self.client, &Self::route(), body, &[])?;
        Ok((status != 200).then_some(Refusal { status, text }))
    }

    /// Has the server check `chunk`, sent as [`send_batch`] will send it, whose dry run
    /// whole was `refusal`. The lines it refuses go to `bad` (which stops the load at the
    /// first, unless --skip-bad), in order, and out of `chunk`; their numbers are added to
    /// `refused`. Answers how many it refused.
    fn check(
        &self,
        name: &str,
        chunk: &mut Vec<(u64, RawEvent)>,
        refusal: Refusal,
        bad: &mut BadLine<'_>,
        refused: &mut Vec<u64>,
    ) -> anyhow::Result<u64> {
        // The first verdict, on the whole batch, is the probe's: not asked again.
        let mut whole = Some(refusal);
        let found = refusals(chunk.len(), !self.skip_bad, &mut |part| match whole
            .take()
            .filter(|_| part.len() == chunk.len())
        {
            Some(r) => self.interpret(name, chunk, part, r),
            None => self.verdict(name, chunk, part),
        })?;
        let mut out = vec![false; chunk.len()];
        for (i, why) in &found {
            let line = chunk.get(*i).map_or(0, |(l, _)| *l);
            bad(line, why.clone())?;
            refused.push(line);
            if let Some(o) = out.get_mut(*i) {
                *o = true;
            }
        }
        let mut i = 0;
        chunk.retain(|_| {
            i += 1;
            !out.get(i - 1).copied().unwrap_or(false)
        });
        Ok(found.len() as u64)
    }

    /// One dry run of the events of `chunk` at `part`.
    fn verdict(
        &self,
        name: &str,
        chunk: &[(u64, RawEvent)],
        part: &[usize],
    ) -> anyhow::Result<Verdict> {
        let events = part.iter().filter_map(|&i| chunk.get(i)).map(|(_, e)| e);
        let body = ndjson(events)?;
        let (status, text, _) = send(self.client, &Self::route(), &body, &[])?;
        if status == 200 {
            return Ok(Verdict::Accepted);
        }
        self.interpret(name, chunk, part, Refusal { status, text })
    }

    /// What the server's refusal of the events of `chunk` at `part` says.
    fn interpret(
        &self,
        name: &str,
        chunk: &[(u64, RawEvent)],
        part: &[usize],
        Refusal { status, text }: Refusal,
    ) -> anyhow::Result<Verdict> {
        let e = server_error(status, &text);
        let lines = |part: &[usize]| {
            let at = |i: Option<&usize>| i.and_then(|&i| chunk.get(i)).map_or(0, |(l, _)| *l);
            format!("{name}: lines {}–{}", at(part.first()), at(part.last()))
        };
        match (e.index, e.code.as_str()) {
            (Some(at), _) if at < part.len() => {
                // "event 3: …" names the event by its place in the request, not the file.
                let prefix = format!("event {at}: ");
                let message = e.message.strip_prefix(&prefix).unwrap_or(&e.message);
                Ok(Verdict::Refused(
                    at,
                    format!("the server refuses it: {message} ({})", e.code),
                ))
            }
            (Some(at), _) => bail!(
                "{}: the server names event {at} of a batch of {}: {e}",
                lines(part),
                part.len()
            ),
            (None, "batch_too_large") => bail!(
                "the server takes fewer events in a batch than --batch {}: {} (its [limits] \
                 max_batch_events); run again with a smaller --batch; nothing was loaded",
                self.batch,
                e.message
            ),
            (None, "body_too_large") => bail!(
                "{}: a batch of {} events is {} bytes, more than the server takes: {}; run \
                 again with a smaller --batch; nothing was loaded",
                lines(part),
                part.len(),
                ndjson(part.iter().filter_map(|&i| chunk.get(i)).map(|(_, e)| e))?.len(),
                e.message
            ),
            (None, _) => Err(anyhow::anyhow!(e)).context(format!(
                "the server's check of {}; nothing was loaded",
                lines(part)
            )),
        }
    }
}

/// The events of a batch of `n` that `judge` refuses — by index, in order, with its reasons —
/// where `judge` checks the events at the indices it is given and names one it refuses, as
/// the server's dry run does. With `first`, only the first refusal met.
///
/// A refused part is cut in two halves (without the refused event) judged on their own: a
/// batch with b refused events takes at most 2b + 2 requests and carries each event about
/// log2(n) times, where re-sending the rest after each refusal would carry it b times. The
/// judge checks events one by one, so halves that pass make a whole that passes; the whole
/// is judged again all the same, as the real request will be, until it passes.
fn refusals(
    n: usize,
    first: bool,
    judge: &mut dyn FnMut(&[usize]) -> anyhow::Result<Verdict>,
) -> anyhow::Result<Vec<(usize, String)>> {
    let mut out = vec![false; n];
    let mut found = Vec::new();
    loop {
        let before = found.len();
        let mut todo: Vec<Vec<usize>> = vec![(0..n).filter(|&i| !out[i]).collect()];
        while let Some(mut part) = todo.pop() {
            if part.is_empty() {
                continue;
            }
            let Verdict::Refused(at, why) = judge(&part)? else {
                continue;
            };
            if at >= part.len() {
                bail!("the server names event {at} of a batch of {}", part.len());
            }
            let i = part.remove(at);
            out[i] = true;
            found.push((i, why));
            if first {
                return Ok(found);
            }
            let right = part.split_off(part.len() / 2);
            todo.push(right);
            todo.push(part);
        }
        if found.len() == before {
            found.sort_unstable_by_key(|(i, _)| *i);
            return Ok(found);
        }
    }
}

fn progress(quiet: bool, total: u64, what: &str) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:20} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The NDJSON of a batch, as loads before 2026-11-26 made it (a JSON value per event):
    /// the bytes that batch's Idempotency-Key is bound to.
    fn ndjson_by_value(events: &[RawEvent]) -> Vec<u8> {
        let mut body = Vec::new();
        for e in events {
            let mut o = Map::new();
            o.insert("ns".into(), json!(e.ns));
            o.insert("key".into(), json!(e.key));
            if let Some(ts) = e.ts {
                o.insert("ts".into(), json!(ts));
            }
            if let Some(n) = e.n {
                o.insert("n".into(), json!(n));
            }
            if !e.dims.is_empty() {
                let dims: Map<String, Value> =
                    e.dims.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                o.insert("dims".into(), Value::Object(dims));
            }
            serde_json::to_writer(&mut body, &Value::Object(o)).unwrap();
            body.push(b'\n');
        }
        body
    }

    /// A load interrupted by an older `tally` and run again with this one sends the same
    /// bytes for each batch (else the server refuses the batches' keys as reused).
    #[test]
    fn batches_are_the_bytes_earlier_loads_sent() {
        let e = |ns: &str, key: &str, ts, n, dims: &[(&str, &str)]| RawEvent {
            ns: ns.into(),
            key: key.into(),
            ts,
            n,
            dims: dims
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let events = vec![
            e("clicks", "lnk_1", Some(1_795_132_800), Some(1), &[]),
            e(
                "clicks",
                "é/\"q\"\\ \u{1}\n",
                None,
                None,
                &[("country", "DE")],
            ),
            e(
                "c",
                "k",
                Some(-5),
                Some(i64::MIN),
                &[("b", "1"), ("a", "2"), ("z", "")],
            ),
            e(
                "c",
                "k",
                Some(i64::MAX),
                Some(-3),
                &[
                    ("a", "1"),
                    ("b", "x"),
                    ("a", "3"),
                    ("b", "y"),
                    ("c", "\u{2028}"),
                ],
            ),
            e("", "", Some(0), Some(0), &[("", "")]),
        ];
        for i in 0..events.len() {
            assert_eq!(
                String::from_utf8(ndjson(events[i..=i].iter()).unwrap()).unwrap(),
                String::from_utf8(ndjson_by_value(&events[i..=i])).unwrap(),
            );
        }
        assert_eq!(ndjson(events.iter()).unwrap(), ndjson_by_value(&events));
    }

    /// Every refused event is found, in order, within the promised requests and bytes,
    /// whichever refused event the judge names first (the server names the first by its own
    /// order of checks, which is not always the body's).
    #[test]
    fn refused_parts_are_cut_in_halves() {
        let every = |k: usize, n: usize| (0..n).filter(|i| i % k == 0).collect::<Vec<_>>();
        let cases: Vec<(usize, Vec<usize>)> = vec![
            (1, vec![0]),
            (1, vec![]),
            (1000, vec![]),
            (1000, every(1, 1000)),
            (1000, every(10, 1000)),
            (1000, vec![999]),
            (5000, every(3, 5000)),
        ];
        for (n, bad) in cases {
            for names_last in [false, true] {
                let (mut requests, mut sent) = (0usize, 0usize);
                let found = refusals(n, false, &mut |part| {
                    requests += 1;
                    sent += part.len();
                    let mut hits = part.iter().enumerate().filter(|(_, i)| bad.contains(i));
                    let hit = if names_last {
                        hits.next_back()
                    } else {
                        hits.next()
                    };
                    Ok(match hit {
                        Some((at, i)) => Verdict::Refused(at, format!("event {i}")),
                        None => Verdict::Accepted,
                    })
                })
                .unwrap();
                let got: Vec<usize> = found.iter().map(|(i, _)| *i).collect();
                assert_eq!(got, bad, "n {n}");
                assert!(found.iter().all(|(i, why)| *why == format!("event {i}")));
                let b = bad.len();
                assert!(requests <= 2 * b + 2, "n {n}, b {b}: {requests} requests");
                let log2 = (usize::BITS - n.leading_zeros()) as usize;
                assert!(sent <= n * (log2 + 2), "n {n}, b {b}: {sent} events sent");
            }
        }
        // Without --skip-bad, the first refusal is the answer.
        let mut requests = 0;
        let found = refusals(10, true, &mut |part| {
            requests += 1;
            Ok(Verdict::Refused(part.len() - 1, "no".into()))
        })
        .unwrap();
        assert_eq!((found.len(), found[0].0, requests), (1, 9, 1));
        // An index past the part is the server's mistake, not a panic.
        let e = refusals(3, false, &mut |_| Ok(Verdict::Refused(3, "no".into()))).unwrap_err();
        assert!(e.to_string().contains("event 3 of a batch of 3"), "{e}");
    }
}
