//! StatsD over real loopback UDP: datagrams in, counts out through the HTTP API, every line's
//! outcome in `/metrics`.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tally_core::store::ManualClock;
use tally_server::{App, Settings};

use super::{NOW, open_engine};

/// A server with a StatsD listener: (HTTP address, StatsD address, stop, thread).
struct Running {
    http: SocketAddr,
    udp: SocketAddr,
    tcp: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(toml: &str) -> Running {
        Running::start_with(toml, None)
    }

    fn start_with(toml: &str, faults: Option<Arc<tally_engine::io::Faults>>) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(NOW));
        let engine = Arc::new(open_engine(dir.path(), &clock, faults));
        let app = App::new(engine, Settings::from_toml(toml).unwrap(), clock);
        app.apply_config_namespaces().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let udp = tally_server::statsd::bind("127.0.0.1:0".parse().unwrap())
                    .await
                    .unwrap();
                let tcp = tally_server::statsd::bind_tcp("127.0.0.1:0".parse().unwrap())
                    .await
                    .unwrap();
                addr_tx
                    .send((
                        listener.local_addr().unwrap(),
                        udp.local_addr().unwrap(),
                        tcp.local_addr().unwrap(),
                    ))
                    .unwrap();
                let (udp_stop_tx, udp_stop_rx) = tokio::sync::oneshot::channel::<()>();
                let statsd = tokio::spawn(tally_server::statsd::serve(
                    tally_server::statsd::Sockets {
                        udp: Some(udp),
                        tcp: Some(tcp),
                    },
                    app.clone(),
                    async {
                        let _ = udp_stop_rx.await;
                    },
                ));
                tally_server::serve(listener, app, async move {
                    let _ = rx.await;
                })
                .await
                .unwrap();
                let _ = udp_stop_tx.send(());
                statsd.await.unwrap();
            });
        });
        let (http, udp, tcp) = addr_rx.recv().unwrap();
        Running {
            http,
            udp,
            tcp,
            stop: Some(tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn get(&self, path: &str) -> (u16, String) {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut resp = agent
            .get(&format!("http://{}{path}", self.http))
            .call()
            .unwrap();
        (
            resp.status().as_u16(),
            resp.body_mut().read_to_string().unwrap(),
        )
    }

    fn json(&self, path: &str) -> Value {
        let (status, text) = self.get(path);
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// `tally_statsd_lines_total` by outcome.
    fn lines(&self) -> Vec<(String, u64)> {
        let (_, text) = self.get("/metrics");
        text.lines()
            .filter_map(|l| l.strip_prefix("tally_statsd_lines_total{outcome=\""))
            .map(|l| {
                let (outcome, n) = l.split_once("\"} ").unwrap();
                (outcome.to_owned(), n.parse().unwrap())
            })
            .collect()
    }

    /// Waits until the listener has decided `n` lines.
    fn wait_for_lines(&self, n: u64) -> Vec<(String, u64)> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = self.lines();
            if lines.iter().map(|(_, n)| n).sum::<u64>() >= n || Instant::now() > deadline {
                return lines;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn datagrams_are_counted_and_read_back_as_totals_and_breakdowns() {
    let s = Running::start(
        r#"
[namespaces.statsd]
tiers = ["1m:2d", "1h:forever"]
breakdown_tiers = ["1h"]
dimensions = ["country", "env"]
"#,
    );
    let ts = NOW - 60;
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    for datagram in [
        format!("page.views:1|c|#country:de|T{ts}\npage.views:2|c|#country:fr|T{ts}"),
        format!("page.views:1|c|@0.5|#env:prod,country:de|T{ts}"),
        "page.views:3|c".to_owned(),
        // Refused, each for its own reason, without their neighbours.
        format!("page.views:1|c|#device:mobile|T{ts}\ntemp:21|g\nnot a line\npage.views:4|c|T{ts}"),
    ] {
        client.send_to(datagram.as_bytes(), s.udp).unwrap();
    }
    let lines = s.wait_for_lines(8);
    let by = |o: &str| lines.iter().find(|(k, _)| k == o).map(|(_, n)| *n);
    assert_eq!(by("accepted"), Some(5), "{lines:?}");
    assert_eq!(by("invalid"), Some(1), "{lines:?}");
    assert_eq!(by("unsupported_type"), Some(1), "{lines:?}");
    assert_eq!(by("malformed"), Some(1), "{lines:?}");
    assert_eq!(by("store_error"), Some(0), "{lines:?}");

    let (from, to) = (NOW - 3600, NOW + 3600);
    let series = s.json(&format!(
        "/v1/ns/statsd/keys/page.views/series?from={from}&to={to}&unit=hour"
    ));
    // 1 + 2 + 1/0.5 + 3 (at now) + 4.
    assert_eq!(series["total"], 12, "{series}");
    let b = s.json(&format!(
        "/v1/ns/statsd/keys/page.views/breakdown?dim=country&from={from}&to={to}&unit=hour"
    ));
    assert_eq!(
        b["values"],
        json!([{"value": "de", "n": 3}, {"value": "fr", "n": 2}]),
        "{b}"
    );
    assert_eq!(b["unset"], 7, "{b}");
    let (_, metrics) = s.get("/metrics");
    assert!(metrics.contains("tally_statsd_lines_total{outcome=\"unsupported_type\"} 1"));
}

#[test]
fn a_batch_the_store_refuses_is_counted_not_a_crash() {
    let faults = Arc::new(tally_engine::io::Faults::default());
    let s = Running::start_with("", Some(faults.clone()));
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(b"ok:1|c", s.udp).unwrap();
    s.wait_for_lines(1);
    faults
        .fail_syncs
        .store(true, std::sync::atomic::Ordering::SeqCst);
    client.send_to(b"lost:1|c\nlost:2|c", s.udp).unwrap();
    let lines = s.wait_for_lines(3);
    let by = |o: &str| lines.iter().find(|(k, _)| k == o).map(|(_, n)| *n);
    assert_eq!(by("accepted"), Some(1), "{lines:?}");
    assert_eq!(by("store_error"), Some(2), "{lines:?}");
    // The listener is still there, and still counts.
    client.send_to(b"later:1|c\ngauge:1|g", s.udp).unwrap();
    let lines = s.wait_for_lines(5);
    let by = |o: &str| lines.iter().find(|(k, _)| k == o).map(|(_, n)| *n);
    assert_eq!(by("store_error"), Some(3), "{lines:?}");
    assert_eq!(by("unsupported_type"), Some(1), "{lines:?}");
}

#[test]
fn tcp_lines_and_mapping_rules_are_counted() {
    use std::io::Write;
    let s = Running::start(
        r#"
[statsd]
namespace = "statsd"

[[statsd.map]]
prefix = "api."
namespace = "api"
key = "{rest}.{tag:org}"
dimensions = ["status"]
"#,
    );
    let ts = NOW - 60;
    let mut conn = std::net::TcpStream::connect(s.tcp).unwrap();
    // A line split across writes is one line; tags not listed are ignored.
    conn.write_all(format!("api.hits:2|c|#org:42,status:200,env:prod|T{ts}\napi.hi").as_bytes())
        .unwrap();
    conn.flush().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    conn.write_all(format!("ts:3|c|#org:42,status:500|T{ts}\r\n").as_bytes())
        .unwrap();
    // Dropped: the key's tag is missing; a line over 64 KiB; the default rule still counts.
    conn.write_all(format!("api.hits:1|c|#status:200|T{ts}\n").as_bytes())
        .unwrap();
    conn.write_all(&vec![b'x'; 70_000]).unwrap();
    conn.write_all(format!("\nweb.views:5|c|T{ts}\n").as_bytes())
        .unwrap();
    // Cut by the close: never counted as a shorter line.
    conn.write_all(b"web.views:9").unwrap();
    let lines = s.wait_for_lines(5);
    let by = |o: &str| lines.iter().find(|(k, _)| k == o).map(|(_, n)| *n);
    assert_eq!(by("accepted"), Some(3), "{lines:?}");
    let (_, metrics) = s.get("/metrics");
    assert!(
        metrics.contains("tally_statsd_tcp_connections 1"),
        "{metrics}"
    );
    drop(conn);
    let lines = s.wait_for_lines(6);
    let by = |o: &str| lines.iter().find(|(k, _)| k == o).map(|(_, n)| *n);
    assert_eq!(by("accepted"), Some(3), "{lines:?}");
    assert_eq!(by("invalid"), Some(1), "{lines:?}");
    assert_eq!(by("malformed"), Some(2), "{lines:?}");

    let (from, to) = (NOW - 3600, NOW + 3600);
    let b = s.json(&format!(
        "/v1/ns/api/keys/hits.42/breakdown?dim=status&from={from}&to={to}&unit=hour"
    ));
    assert_eq!(b["total"], 5, "{b}");
    assert_eq!(
        b["values"],
        json!([{"value": "500", "n": 3}, {"value": "200", "n": 2}]),
        "{b}"
    );
    let series = s.json(&format!(
        "/v1/ns/statsd/keys/web.views/series?from={from}&to={to}&unit=hour"
    ));
    assert_eq!(series["total"], 5, "{series}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, metrics) = s.get("/metrics");
        if metrics.contains("tally_statsd_tcp_connections 0") {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn tcp_connections_past_the_cap_are_closed_and_the_rest_still_count() {
    use std::io::{Read, Write};
    let s = Running::start("");
    let max = tally_server::statsd::tcp::MAX_TCP_CONNECTIONS;
    let mut held: Vec<std::net::TcpStream> = (0..max)
        .map(|_| std::net::TcpStream::connect(s.tcp).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s
        .get("/metrics")
        .1
        .contains(&format!("tally_statsd_tcp_connections {max}"))
    {
        assert!(
            Instant::now() < deadline,
            "the held connections were not all served"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut extra = std::net::TcpStream::connect(s.tcp).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(extra.read(&mut buf).unwrap(), 0, "closed by the server");
    // A held connection still counts, and once one closes a new one is served.
    held[0].write_all(b"held:1|c\n").unwrap();
    s.wait_for_lines(1);
    held.truncate(max - 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s
        .get("/metrics")
        .1
        .contains(&format!("tally_statsd_tcp_connections {}", max - 1))
    {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut again = std::net::TcpStream::connect(s.tcp).unwrap();
    again.write_all(b"again:1|c\n").unwrap();
    let lines = s.wait_for_lines(2);
    assert!(lines.contains(&("accepted".to_owned(), 2)), "{lines:?}");
}

/// Datagrams that arrived before a stop (waiting in the kernel's buffer) are read and
/// applied, not dropped with the socket.
#[test]
fn datagrams_waiting_at_a_stop_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(NOW));
    let engine = Arc::new(open_engine(dir.path(), &clock, None));
    let app = App::new(engine.clone(), Settings::default(), clock);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    rt.block_on(async {
        let udp = tally_server::statsd::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let to = udp.local_addr().unwrap();
        for _ in 0..100 {
            client.send_to(b"waiting:1|c", to).unwrap();
        }
        // Stopped as soon as it starts: everything it counts, it read after the stop.
        tally_server::statsd::serve(
            tally_server::statsd::Sockets {
                udp: Some(udp),
                tcp: None,
            },
            app,
            async {},
        )
        .await;
    });
    use tally_core::store::Store;
    let (ns, key) = (
        tally_core::model::Namespace::new("statsd").unwrap(),
        tally_core::model::Key::new("waiting").unwrap(),
    );
    let read = tally_core::store::KeyRead {
        ns: &ns,
        key: &key,
        resolution: tally_core::model::Duration::from_secs(3600).unwrap(),
        from: 0,
        to: NOW + 3600,
        want: tally_core::store::Want::Totals,
        sum_subtotals: false,
        keep: None,
    };
    let d = engine.read(&[read]).unwrap().pop().unwrap();
    assert_eq!(d.totals.iter().map(|(_, n)| n).sum::<i64>(), 100);
}
