//! The `inferscope` binary: one CLI for the server and its tools.

use clap::{Parser, Subcommand};
use inferscope_bench::BenchCommand;
use inferscope_server::ServeArgs;

/// inferscope: an LLM inference server with first-class observability.
#[derive(Parser)]
#[command(name = "inferscope", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a model over the OpenAI API, with metrics at /metrics.
    Serve(Box<ServeArgs>),
    /// Serving benchmarks against any OpenAI-compatible server.
    #[command(subcommand)]
    Bench(BenchCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => Ok(inferscope_server::run(*args).await?),
            Command::Bench(cmd) => inferscope_bench::run(cmd).await,
        }
    })
}
