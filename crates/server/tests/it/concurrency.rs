//! Eight writers and a reader at once: every acknowledged event is counted exactly, and the
//! reader always sees subtotals that add up to the total.

use serde_json::json;
use tally_server::Settings;

use crate::{NOW, Server};

#[test]
fn eight_writers_one_reader_exact_totals() {
    let s = std::sync::Arc::new(Server::start(Settings::default()));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..40 {
                    let batch: Vec<_> = (0..25)
                        .map(|j| json!({"ns": "c", "key": "hot", "ts": NOW - 60 - j, "n": w + 1, "dims": {"country": format!("c{}", (i + j) % 4)}}))
                        .collect();
                    assert_eq!(s.post("/v1/events", &json!(batch).to_string()), (200, json!({"accepted": 25})));
                    assert_eq!(s.post(&format!("/v1/ns/c/keys/w{w}/incr?n=1"), "").0, 200);
                }
            })
        })
        .collect();
    let reader = {
        let s = s.clone();
        std::thread::spawn(move || {
            let mut reads = 0;
            for _ in 0..60 {
                let (st, b) = s.get(&format!(
                    "/v1/ns/c/keys/hot/breakdown?dim=country&from={}&to={}&unit=hour",
                    NOW - 7200,
                    NOW
                ));
                if st == 404 {
                    continue; // before the first write created the namespace
                }
                assert_eq!(st, 200, "{b}");
                let vals: i64 = b["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v["n"].as_i64().unwrap())
                    .sum();
                assert_eq!(
                    vals + b["other"].as_i64().unwrap(),
                    b["total"].as_i64().unwrap()
                );
                assert_eq!(b["unset"], 0);
                reads += 1;
            }
            reads
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    assert!(reader.join().unwrap() > 0);
    let expected: i64 = (1..=8).map(|w| w * 40 * 25).sum();
    let (_, v) = s.get(&format!(
        "/v1/ns/c/top?from={}&to={}&unit=hour",
        NOW - 7200,
        NOW
    ));
    let hot = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == "hot")
        .unwrap()["n"]
        .as_i64()
        .unwrap();
    assert_eq!(hot, expected);
    for w in 0..8 {
        let (_, win) = s.get(&format!("/v1/ns/c/keys/w{w}/window?last=1h"));
        assert_eq!(win["n"], 40);
    }
}
