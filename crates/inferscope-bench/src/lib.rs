//! inferscope-bench: a serving benchmark for any OpenAI-compatible server,
//! compatible with `vllm bench serve` (flags, report, result JSON), plus a
//! server-side view from `/metrics`, run comparison and rate sweeps.

pub mod arrivals;
pub mod cli;
pub mod client;
pub mod compare;
pub mod connect;
pub mod dataset;
pub mod error;
pub mod html;
pub mod mock;
pub mod plot;
pub mod progress;
pub mod report;
pub mod result_json;
pub mod rng;
pub mod runner;
pub mod serve;
pub mod server_tokenizer;
pub mod server_view;
pub mod sse;
pub mod statistics;
pub mod sweep;
pub mod timeline;
pub mod tokenizer;

pub use cli::{BenchCommand, BenchServeArgs, CompareArgs, SweepArgs};
pub use error::BenchError;

/// Runs a `bench` subcommand.
pub async fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Serve(args) => {
            serve::run_serve(&args).await?;
        }
        BenchCommand::Compare(args) => compare::run(&args)?,
        BenchCommand::Sweep(args) => {
            sweep::run(&args).await?;
        }
    }
    Ok(())
}
