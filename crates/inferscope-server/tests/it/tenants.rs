//! Tenants from `--api-key-file`: each key names its tenant (401 otherwise),
//! and under a flood from one tenant, fair admission serves another's
//! requests without waiting behind the flood, where FCFS makes them wait.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// A key file for tenants `flood` and `light`, removed when dropped.
struct KeyFile(std::path::PathBuf);

impl Drop for KeyFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn key_file() -> (KeyFile, String) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!(
        "inferscope-tenants-{}-{n}.json",
        std::process::id()
    ));
    std::fs::write(
        &path,
        r#"{"tenants": [{"name": "flood", "key": "key-flood"},
                        {"name": "light", "key": "key-light"}]}"#,
    )
    .expect("write key file");
    let arg = path.to_string_lossy().into_owned();
    (KeyFile(path), arg)
}

async fn complete(addr: std::net::SocketAddr, key: &str) -> Reply {
    let body = json!({"prompt": "hello there", "max_tokens": 16, "ignore_eos": true});
    let auth = format!("Bearer {key}");
    call(
        addr,
        "POST",
        "/v1/completions",
        &body.to_string(),
        &[
            ("content-type", "application/json"),
            ("authorization", &auth),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_name_tenants_and_others_get_401() {
    let (_dir, keys) = key_file();
    let server = start(&["--api-key-file", &keys]).await;
    let addr = server.addr;
    assert_eq!(complete(addr, "key-light").await.status, 200);
    assert_eq!(complete(addr, "key-flood").await.status, 200);
    let wrong = complete(addr, "key-nobody").await;
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(wrong.json()["error"]["type"], "authentication_error");
    let none = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 1}),
    )
    .await;
    assert_eq!(none.status, 401);
    server.shutdown(Duration::from_secs(5)).await;
}

/// Mean latency of `light`'s requests, sent one after another, while
/// `flood` keeps far more requests in flight than the engine runs at once.
async fn light_latency_under_flood(policy: &str) -> Duration {
    let (_dir, keys) = key_file();
    let server = start(&[
        "--api-key-file",
        &keys,
        "--scheduling-policy",
        policy,
        "--max-num-seqs",
        "4",
        // 2 ms a step: the flood takes about a second to drain.
        "--sim-profile",
        "tiny,t_fixed_ms=2",
    ])
    .await;
    let addr = server.addr;
    let flood: Vec<_> = (0..120)
        .map(|_| tokio::spawn(async move { complete(addr, "key-flood").await.status }))
        .collect();
    // Let the flood fill the waiting queue first.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut total = Duration::ZERO;
    for _ in 0..3 {
        let t = Instant::now();
        let r = complete(addr, "key-light").await;
        assert_eq!(r.status, 200, "{}", r.body);
        total += t.elapsed();
    }
    for f in flood {
        assert_eq!(f.await.expect("flood task"), 200);
    }
    server.shutdown(Duration::from_secs(5)).await;
    total / 3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_admission_serves_a_light_tenant_through_a_flood() {
    let fair = light_latency_under_flood("fair").await;
    let fcfs = light_latency_under_flood("fcfs").await;
    eprintln!("light tenant's mean latency under the flood: fair {fair:?}, fcfs {fcfs:?}");
    // Under FCFS each light request waits behind the whole flood ahead of
    // it (about 30 batches of 16 steps); fairly, behind one flood request.
    assert!(
        fair * 4 < fcfs,
        "light tenant's mean latency: fair {fair:?}, fcfs {fcfs:?}"
    );
}
