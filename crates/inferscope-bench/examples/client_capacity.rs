//! Client-capacity benchmark: how many requests per second the client sustains
//! against a zero-latency mock server, and how far actual send times lag the
//! Poisson schedule. The mock runs in the same process on its own runtime.
//!
//! Run: `cargo run --release -p inferscope-bench --example client_capacity -- [RATE ...]`
//! (default rates 1000 2000 4000; 10 s of traffic per rate, 4 output tokens per request).

use inferscope_bench::arrivals;
use inferscope_bench::client::{ApiClient, ApiKind, ClientConfig};
use inferscope_bench::dataset::{DatasetSpec, sample};
use inferscope_bench::mock::{MockConfig, MockServer};
use inferscope_bench::rng::Rng;
use inferscope_bench::runner::{Plan, execute};
use inferscope_bench::statistics::percentile;
use std::sync::Arc;
use std::time::Duration;

fn main() -> anyhow::Result<()> {
    let rates: Vec<f64> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<f64>())
        .collect::<Result<_, _>>()?;
    let rates = if rates.is_empty() {
        vec![1000.0, 2000.0, 4000.0]
    } else {
        rates
    };
    let secs = 10.0;

    // The mock gets its own runtime thread so server work is not scheduled by the client's runtime.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let mock = server_rt.block_on(MockServer::start(MockConfig::default()))?;
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    println!(
        "| target req/s | requests | completed | failed | achieved req/s | send lag p50 (ms) | p99 (ms) | max (ms) | of which dispatch p99 (ms) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for rate in rates {
        let n = (rate * secs) as usize;
        let mut rng = Rng::new(1);
        let spec = DatasetSpec::Random {
            input_len: 16,
            output_len: 4,
            range_ratio: 0.0,
            prefix_len: 0,
        };
        let requests = sample(&spec, n, &mut rng)?;
        let offsets = arrivals::schedule(n, rate, 1.0, &mut rng);
        let client = Arc::new(ApiClient::new(ClientConfig {
            url: format!("{}/v1/completions", mock.base_url()),
            api: ApiKind::Completions,
            model: "mock-model".into(),
            ignore_eos: true,
            sampling: Default::default(),
            read_timeout: Duration::from_secs(30),
            api_key: None,
            request_ids: Default::default(),
        })?);
        let run = client_rt.block_on(execute(
            client,
            Plan {
                requests,
                offsets,
                max_concurrency: None,
                progress: false,
            },
        ));
        let completed = run.outputs.iter().filter(|o| o.success).count();
        let mut lags: Vec<f64> = run.outputs.iter().map(|o| o.send_lag * 1000.0).collect();
        lags.sort_by(f64::total_cmp);
        let mut dispatch: Vec<f64> = run
            .outputs
            .iter()
            .map(|o| o.dispatch_lag * 1000.0)
            .collect();
        dispatch.sort_by(f64::total_cmp);
        println!(
            "| {rate:.0} | {n} | {completed} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} |",
            n - completed,
            completed as f64 / run.duration_s,
            percentile(&lags, 50.0),
            percentile(&lags, 99.0),
            lags.last().copied().unwrap_or(0.0),
            percentile(&dispatch, 99.0),
        );
        if let Some(e) = run.outputs.iter().find(|o| !o.success) {
            println!("first error: {}", e.error);
        }
    }
    Ok(())
}
