//! `tally serve`: open the port (answering 503 while the engine recovers its archive and
//! log), then serve the API — over TLS with `--tls-cert`/`--tls-key` —, every minute sweep expired counters, flush closed periods into archive segments and
//! compact them, and on
//! SIGTERM/SIGINT stop accepting, finish in-flight requests, make the log durable and exit
//! 0 — within 10 s. With `--backend redis://…` or `redis+cluster://…` the store is Redis:
//! no data directory, no log, no housekeeping of ours (Redis expires what retention drops).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tally_core::store::SystemClock;
use tally_engine::{Config, Engine};
use tally_redis::RedisStore;
use tally_server::tls::Tls;
use tally_server::{App, Routes, Settings};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Data directory of the embedded engine.
    #[arg(long, env = "TALLY_DATA", default_value = "./tally-data")]
    data: PathBuf,
    /// Address to listen on.
    #[arg(long, env = "TALLY_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Configuration file (TOML: fsync, namespaces, defaults, limits, tokens).
    #[arg(long, env = "TALLY_CONFIG")]
    config: Option<PathBuf>,
    /// Backend: empty for the embedded engine, else redis://host:port/db or
    /// redis+cluster://host:port,host:port,… (then --data is not used).
    #[arg(long, env = "TALLY_BACKEND", hide_env_values = true)]
    backend: Option<String>,
    /// TLS certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "TALLY_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM); needs --tls-cert.
    #[arg(long, env = "TALLY_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Also count StatsD / DogStatsD counter lines received on this UDP address (overrides
    /// `[statsd] listen` in the config).
    #[arg(long, env = "TALLY_STATSD")]
    statsd: Option<SocketAddr>,
    /// Also count StatsD / DogStatsD lines received on this TCP address, newline-delimited
    /// (overrides `[statsd] listen_tcp` in the config).
    #[arg(long, env = "TALLY_STATSD_TCP")]
    statsd_tcp: Option<SocketAddr>,
    /// Start even if log records are missing (a deleted or lost log file), or a segment the
    /// manifest lists is missing or damaged where opening reads it: the missing range, or the
    /// segment (its file renamed `….tls.damaged`), is logged and lost for good, less what the
    /// log still holds of that segment's period. Without it, such a data directory refuses to
    /// open.
    #[arg(long, env = "TALLY_ACCEPT_DATA_LOSS")]
    accept_data_loss: bool,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // Everything is validated before anything starts.
    let settings = match &args.config {
        None => Settings::default(),
        Some(path) => {
            let text = tally_server::read_settings_file(path)
                .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other))
                .with_context(|| format!("reading config {}", path.display()))?;
            Settings::from_toml(&text).with_context(|| format!("config {}", path.display()))?
        }
    };
    let fsync = settings.fsync;
    let redis = match args.backend.as_deref().filter(|b| !b.is_empty()) {
        None => None,
        Some(b) if b.starts_with("redis://") || b.starts_with("redis+cluster://") => {
            Some(b.to_owned())
        }
        Some(b) => bail!(
            "backend {:?} is not one this build knows: give none for the embedded engine, \
             redis://host:port/db or redis+cluster://host:port,host:port,…",
            tally_redis::redact(b)
        ),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Tls::load(cert, key)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let limits = settings.server;
    let statsd_listen = settings.statsd.listen;
    let statsd_listen_tcp = settings.statsd.listen_tcp;
    let mut cfg = Config::new(&args.data);
    cfg.fsync = fsync;
    cfg.accept_data_loss = args.accept_data_loss;
    cfg.max_idempotency_answers = limits.max_idempotency_keys;
    // Without tokens every key is the same client's: only the whole bound applies.
    cfg.max_idempotency_answers_per_scope =
        (!settings.tokens.is_empty()).then_some(limits.max_idempotency_keys_per_token);
    cfg.max_future_secs = settings.limits.max_future_secs;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let served = rt.block_on(async move {
        // Handlers first: a SIGTERM from here on is a clean shutdown, never the default
        // action (which killed a server signalled right after its ready line).
        let stop = shutdown_signal()?;
        // The port opens first and answers 503 while the engine recovers, so a load
        // balancer sees "recovering", not "connection refused".
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr()?;
        // Once the flags and the config are taken: a refusal stays one line.
        open_files_limit();
        let mut statsd = tally_server::statsd::Sockets::default();
        if let Some(a) = args.statsd.or(statsd_listen) {
            statsd.udp = Some(
                tally_server::statsd::bind(a)
                    .await
                    .with_context(|| format!("listening for StatsD on udp {a}"))?,
            );
        }
        if let Some(a) = args.statsd_tcp.or(statsd_listen_tcp) {
            statsd.tcp = Some(
                tally_server::statsd::bind_tcp(a)
                    .await
                    .with_context(|| format!("listening for StatsD on tcp {a}"))?,
            );
        }
        let statsd = (statsd.udp.is_some() || statsd.tcp.is_some()).then_some(statsd);
        let routes = Routes::recovering();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(tally_server::serve_with(
            listener,
            limits,
            routes.clone(),
            tls,
            async move {
                let _ = rx.await;
            },
        ));
        if let Some(url) = redis {
            // Redis: the store is stateless here; connecting checks the layout version.
            // (Named without a password it may hold, here and in every message.)
            let shown = tally_redis::redact(&url);
            tracing::info!("connecting to {shown} (answering 503 on {scheme}://{addr} meanwhile)");
            let u = url.clone();
            let future = settings.limits.max_future_secs;
            let answers = (
                limits.max_idempotency_keys,
                (!settings.tokens.is_empty()).then_some(limits.max_idempotency_keys_per_token),
            );
            let store = tokio::task::spawn_blocking(move || {
                RedisStore::connect(&u).map(|s| {
                    s.with_max_future_secs(future)
                        .with_answer_bounds(answers.0, answers.1)
                })
            })
                .await
                .context("connecting to Redis")?
                .map_err(|e| anyhow::anyhow!(e.detail()))
                .with_context(|| format!("backend {shown}"))?;
            let app = App::new(Arc::new(store), settings, Arc::new(SystemClock));
            let a = app.clone();
            tokio::task::spawn_blocking(move || a.apply_config_namespaces())
                .await
                .context("applying the config's namespaces")?
                .context("applying the config's namespaces")?;
            routes.ready(&app);
            let statsd = statsd.map(|sockets| Statsd::start(sockets, &app));
            tracing::info!("tally listening on {scheme}://{addr} (backend {shown})");
            stop.await;
            tracing::info!("shutting down: finishing in-flight requests");
            let _ = tx.send(());
            let statsd = statsd.map(Statsd::stopping);
            if tokio::time::timeout(Duration::from_secs(8), server).await.is_err() {
                tracing::warn!("in-flight requests did not finish within 8 s; stopping anyway");
            }
            if let Some(task) = statsd {
                finish_statsd(task).await;
            }
            tracing::info!("bye");
            return Ok(());
        }
        tracing::info!("recovering {} (answering 503 on {scheme}://{addr} meanwhile)", args.data.display());
        tally_engine::segment::dicts::set_budget(settings.server.dictionary_cache_bytes);
        let opened = tokio::task::spawn_blocking(move || Engine::open(cfg))
            .await
            .context("opening the engine")?;
        let engine = Arc::new(
            opened.with_context(|| format!("opening data directory {}", args.data.display()))?,
        );
        let app = App::new(engine.clone(), settings, Arc::new(SystemClock));
        let a = app.clone();
        tokio::task::spawn_blocking(move || a.apply_config_namespaces())
            .await
            .context("applying the config's namespaces")?
            .context("applying the config's namespaces")?;
        routes.ready(&app);
        let statsd = statsd.map(|sockets| Statsd::start(sockets, &app));
        let rec = engine.recovery();
        tracing::info!(
            "tally listening on {scheme}://{addr} (data {}, fsync {fsync}, {} archive segments, replayed {} events in {} ms)",
            args.data.display(),
            rec.segments,
            rec.events,
            rec.elapsed.as_millis()
        );
        let sweeper = {
            let engine = engine.clone();
            let mut pace = tally_engine::ScrubPace::new(
                app.settings().server.scrub_percent,
                std::time::Instant::now(),
            );
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                // After a long housekeeping, the next tick a minute on, not the missed ones
                // at once (the scrub runs at most once a minute).
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    // The tick as scheduled: paced from it, a scrub is due again on time.
                    let at = tick.tick().await.into_std();
                    let e = engine.clone();
                    let scrub = pace.due(at);
                    if let Ok(Some(took)) =
                        tokio::task::spawn_blocking(move || maintain(&e, scrub)).await
                    {
                        pace.ran(at, took);
                    }
                }
            })
        };
        stop.await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(());
        // StatsD stops reading now and applies what has arrived meanwhile.
        let statsd = statsd.map(Statsd::stopping);
        if tokio::time::timeout(Duration::from_secs(8), server).await.is_err() {
            tracing::warn!("in-flight requests did not finish within 8 s; stopping anyway");
        }
        sweeper.abort();
        if let Some(task) = statsd {
            finish_statsd(task).await;
        }
        let e = engine.clone();
        tokio::task::spawn_blocking(move || {
            let synced = e.sync();
            e.close();
            synced
        })
        .await
        .context("closing the engine")?
        .context("making the log durable")?;
        tracing::info!("log synced; bye");
        Ok(())
    });
    // Dropping the runtime would wait for every blocking task; one still reading (an
    // export whose client left, a query past the grace period) must not hold up the exit.
    rt.shutdown_timeout(Duration::from_secs(1));
    served
}

/// Waits for a stopping StatsD listener to apply what it holds: at most 1 s past the HTTP
/// grace period, within SIGTERM's 10 s.
async fn finish_statsd(task: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(Duration::from_secs(1), task)
        .await
        .is_err()
    {
        tracing::warn!("StatsD lines still being applied after the grace period; stopping anyway");
    }
}

/// The StatsD listener (`--statsd`), once the app serves.
struct Statsd {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Statsd {
    fn start(sockets: tally_server::statsd::Sockets, app: &App) -> Statsd {
        let names = app.settings().statsd.map.namespaces();
        let ns = format!(
            "namespace{} {}",
            if names.len() == 1 { "" } else { "s" },
            names.join(", ")
        );
        if let Some(a) = sockets.udp.as_ref().and_then(|s| s.local_addr().ok()) {
            tracing::info!("counting StatsD lines on udp {a} into {ns}");
        }
        if let Some(a) = sockets.tcp.as_ref().and_then(|s| s.local_addr().ok()) {
            tracing::info!("counting StatsD lines on tcp {a} into {ns}");
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tally_server::statsd::serve(
            sockets,
            app.clone(),
            async move {
                let _ = stopped.await;
            },
        ));
        Statsd { stop, task }
    }

    /// Tells the listener to stop reading: it reads what has arrived already and applies
    /// it, while in-flight HTTP requests finish.
    fn stopping(self) -> tokio::task::JoinHandle<()> {
        let _ = self.stop.send(());
        self.task
    }
}

/// Below this many descriptors a server is soon short of them (see `raise_open_files_limit`
/// in main.rs).
const FEW_OPEN_FILES: u64 = 4096;

/// Logs the limit on open files the server runs with (`main` raised it to the hard limit),
/// and warns when it is low.
fn open_files_limit() {
    match rlimit::getrlimit(rlimit::Resource::NOFILE) {
        Ok((soft, _)) if soft < FEW_OPEN_FILES => tracing::warn!(
            limit = soft,
            "few open files allowed: every connection holds one, and archive segments keep at \
             most a quarter of them (reopening files past that); past the limit connections \
             are refused; raise it (ulimit -n, LimitNOFILE=) to {FEW_OPEN_FILES} or more"
        ),
        Ok((soft, _)) => tracing::info!(limit = soft, "open files allowed"),
        Err(e) => tracing::warn!(error = %e, "could not read the limit on open files"),
    }
}

/// Installs the SIGTERM and SIGINT handlers now; the future completes at the first signal.
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {},
                _ = int.recv() => {},
            }
        })
    }
    #[cfg(not(unix))]
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}

/// The minute's housekeeping: expired counters out of memory, closed periods into the
/// archive (and the log truncated behind them), then compaction (deltas merged, segments
/// past retention dropped), then, when `scrub`, one archive segment verified: answers how
/// long that took, from which the next scrub is paced (`[limits] scrub_percent`). A failed
/// step changes nothing and is tried again a minute later; it is logged, never fatal.
///
/// A step cut short because the server is stopping (the engine closed under it) is not
/// a failure: it says so once, at debug level, and the rest is skipped.
fn maintain(engine: &Engine, scrub: bool) -> Option<Duration> {
    let stopping = || {
        let closed = engine.is_closed();
        if closed {
            tracing::debug!("housekeeping stopped: the server is shutting down");
        }
        closed
    };
    engine.sweep();
    match engine.flush() {
        Err(_) if stopping() => return None,
        Ok(r) if r.segments > 0 => tracing::info!(
            segments = r.segments,
            keys = r.keys,
            data_points = r.data_points,
            bytes = r.bytes,
            wal_files_removed = r.wal_files_removed,
            "flushed closed periods into the archive"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e.detail(), "flush failed; will retry"),
    }
    match engine.compact() {
        Err(_) if stopping() => {}
        Ok(r) if r.dropped + r.merged > 0 => tracing::info!(
            dropped = r.dropped,
            merged = r.merged,
            written = r.written,
            "compacted the archive"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e.detail(), "compaction failed; will retry"),
    }
    // One segment read whole against its checksums: damage shows in /healthz before a
    // query meets it.
    if !scrub {
        return None;
    }
    let start = std::time::Instant::now();
    match engine.scrub_next() {
        Ok(Some(file)) => {
            tracing::debug!(file = %file.display(), took_ms = start.elapsed().as_millis(), "verified an archive segment")
        }
        Ok(None) => {}
        Err(_) if stopping() => {}
        Err(e) => tracing::error!(error = %e.detail(), "verifying the archive found damage"),
    }
    Some(start.elapsed())
}
