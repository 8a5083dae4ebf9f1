//! The synchronous `Store` on the store's own runtime: called from a plain thread, from
//! another runtime's `spawn_blocking` (the server's reads) and `block_in_place` (its writes),
//! and dropped inside a runtime.

use std::sync::Arc;

use tally_core::ingest::Defaults;
use tally_core::store::Store;
use tally_redis::RedisStore;
use tally_redis::testing::RedisServer;

use crate::{batch, raw, real_now, total};

#[test]
fn works_from_plain_threads_spawn_blocking_and_block_in_place() {
    let server = RedisServer::start();
    let store = Arc::new(RedisStore::connect(&server.url()).unwrap());
    let now = real_now();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    let raws = [raw("m", &format!("k{t}"), now, i, &[])];
                    let b = batch(&*store, now, &raws, &Defaults::default());
                    store.apply(&b).unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(total(&*store, "m", "k3", 3600), 45);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let s = store.clone();
    // One event and a health check, as a request's store call makes them.
    let call = move |s: Arc<RedisStore>| {
        let raws = [raw("m", "shared", now, 1, &[("country", "fr")])];
        let b = batch(&*s, now, &raws, &Defaults::default());
        s.apply(&b).unwrap();
        s.health().unwrap();
    };
    let n = rt.block_on(async move {
        let pooled: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                tokio::task::spawn_blocking(move || call(s))
            })
            .collect();
        // In tasks on the workers, giving each up for the call (`App::blocking`).
        let in_place: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                tokio::spawn(async move { tokio::task::block_in_place(|| call(s)) })
            })
            .collect();
        for t in pooled.into_iter().chain(in_place) {
            t.await.unwrap();
        }
        let s2 = s.clone();
        tokio::task::spawn_blocking(move || total(&*s2, "m", "shared", 3600))
            .await
            .unwrap()
    });
    assert_eq!(n, 16);

    // Dropping the last handle inside a runtime must not panic.
    rt.block_on(async move {
        drop(store);
    });
}
