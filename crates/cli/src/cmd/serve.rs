//! `tally serve`: open the engine (recovering its archive and log), start the HTTP server,
//! every minute sweep expired counters, flush closed periods into archive segments and
//! compact them, and on
//! SIGTERM/SIGINT stop accepting, finish in-flight requests, make the log durable and exit
//! 0 — within 10 s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tally_core::store::SystemClock;
use tally_engine::{Config, Engine};
use tally_server::{App, Settings};

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
    /// Backend: empty for the embedded engine. (redis:// and redis+cluster:// are not built yet.)
    #[arg(long, env = "TALLY_BACKEND")]
    backend: Option<String>,
    /// Start even if log records are missing (a deleted or lost log file): the missing range
    /// is logged and lost for good. Without it, such a data directory refuses to open.
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
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading config {}", path.display()))?;
            Settings::from_toml(&text).with_context(|| format!("config {}", path.display()))?
        }
    };
    let fsync = settings.fsync;
    if let Some(b) = args.backend.as_deref().filter(|b| !b.is_empty()) {
        bail!(
            "backend {b:?} is not available in this build: only the embedded engine (no --backend) is"
        );
    }
    let mut cfg = Config::new(&args.data);
    cfg.fsync = fsync;
    cfg.accept_data_loss = args.accept_data_loss;
    let engine = Arc::new(
        Engine::open(cfg)
            .with_context(|| format!("opening data directory {}", args.data.display()))?,
    );
    let app = App::new(engine.clone(), settings, Arc::new(SystemClock));
    app.apply_config_namespaces()
        .context("applying the config's namespaces")?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let rec = engine.recovery();
        tracing::info!(
            "tally listening on http://{addr} (data {}, fsync {fsync}, {} archive segments, replayed {} events in {} ms)",
            args.data.display(),
            rec.segments,
            rec.events,
            rec.elapsed.as_millis()
        );
        let sweeper = {
            let engine = engine.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(60));
                loop {
                    tick.tick().await;
                    let e = engine.clone();
                    let _ = tokio::task::spawn_blocking(move || maintain(&e)).await;
                }
            })
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(tally_server::serve(listener, app, async move {
            let _ = rx.await;
        }));
        shutdown_signal().await;
        tracing::info!("shutting down: finishing in-flight requests");
        let _ = tx.send(());
        if tokio::time::timeout(Duration::from_secs(8), server).await.is_err() {
            tracing::warn!("in-flight requests did not finish within 8 s; stopping anyway");
        }
        sweeper.abort();
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
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// The minute's housekeeping: expired counters out of memory, closed periods into the
/// archive (and the log truncated behind them), then compaction (deltas merged, segments
/// past retention dropped). A failed step changes nothing and is tried again a minute
/// later; it is logged, never fatal.
fn maintain(engine: &Engine) {
    engine.sweep();
    match engine.flush() {
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
        Ok(r) if r.dropped + r.merged > 0 => tracing::info!(
            dropped = r.dropped,
            merged = r.merged,
            written = r.written,
            "compacted the archive"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e.detail(), "compaction failed; will retry"),
    }
}
