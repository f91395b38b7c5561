//! A standalone mock OpenAI-compatible server (fixed TTFT and inter-token
//! delay) to try `inferscope bench` without a model.
//!
//! Run: `cargo run -p inferscope-bench --example mock_server -- [PORT] [TTFT_MS] [ITL_MS] [NAMESPACE]`
//! (defaults 8000 50 10 inferscope; `/metrics` is served in that namespace).

use inferscope_bench::mock::{MockConfig, MockServer};
use std::time::Duration;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| -> anyhow::Result<u64> {
        Ok(args.get(i).map(|s| s.parse()).transpose()?.unwrap_or(d))
    };
    let port = u16::try_from(num(0, 8000)?)?;
    let cfg = MockConfig {
        ttft: Duration::from_millis(num(1, 50)?),
        itl: Duration::from_millis(num(2, 10)?),
        metrics_namespace: Some(args.get(3).cloned().unwrap_or_else(|| "inferscope".into())),
        ..Default::default()
    };
    let server = MockServer::start_on(&format!("127.0.0.1:{port}"), cfg).await?;
    println!("mock server on {}", server.base_url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
