//! Re-records the `/metrics` fixtures under `tests/fixtures/` that the
//! doctor's fixture tests read:
//! `cargo run -p inferscope-doctor --example record_fixtures`.
//! Each fixture is a pair of scrapes two seconds apart under load. The vLLM
//! one comes from `--metrics-namespace vllm` with the families vLLM does not
//! export (device and host time, steps, batch size) removed.

#[path = "../tests/it/common/mod.rs"]
mod common;

use std::time::Duration;

use common::{Load, Shape, WARMUP};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let cases: [(&str, &[&str], usize, Shape); 2] = [
        (
            "inferscope_queue",
            &[
                "--sim-profile",
                "tiny,t_weights_ms=5",
                "--max-num-seqs",
                "1",
            ],
            6,
            Shape {
                prompt_len: 24,
                max_tokens: 8,
                guided_regex: None,
            },
        ),
        (
            "inferscope_as_vllm_kv",
            &[
                "--sim-profile",
                "tiny,t_weights_ms=2,kv_tokens=2000",
                "--max-model-len",
                "1024",
                "--metrics-namespace",
                "vllm",
                "--data-parallel-size",
                "2",
            ],
            12,
            Shape {
                prompt_len: 100,
                max_tokens: 300,
                guided_regex: None,
            },
        ),
    ];
    for (name, flags, clients, shape) in cases {
        let srv = common::start(flags).await;
        let load = Load::start(srv.addr, clients, shape);
        tokio::time::sleep(WARMUP).await;
        let url = format!("http://{}/metrics", srv.addr);
        let mut texts = Vec::new();
        for i in 0..2 {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let t = inferscope_doctor::client::get_text(&url, Duration::from_secs(5))
                .await
                .expect("scrape");
            texts.push(t);
        }
        load.stop().await;
        srv.shutdown(Duration::from_secs(5)).await;
        for (t, which) in texts.iter().zip(["before", "after"]) {
            let kept: String = t
                .lines()
                .filter(|l| {
                    !name.starts_with("vllm")
                        || ![
                            "device_busy_seconds",
                            "engine_step_duration_seconds",
                            "engine_idle_seconds",
                            "engine_steps",
                            "batch_size",
                        ]
                        .iter()
                        .any(|f| l.contains(&format!("vllm:{f}")))
                })
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(dir.join(format!("{name}_{which}.prom")), kept).expect("write");
        }
    }
}
