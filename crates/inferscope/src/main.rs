//! The `inferscope` binary: one CLI for the server and its tools.

use clap::{Parser, Subcommand};
use inferscope_bench::BenchCommand;
use inferscope_doctor::{DoctorArgs, TopArgs};
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
    /// Diagnose a running server from its /metrics: ranked findings with evidence and actions.
    Doctor(DoctorArgs),
    /// Live terminal view of a server's /metrics.
    Top(TopArgs),
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
    if matches!(cli.command, Command::Serve(_)) {
        inferscope_server::limit_allocator_arenas();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => {
                inferscope_server::run(*args).await?;
                Ok(0)
            }
            Command::Bench(cmd) => inferscope_bench::run(cmd).await.map(|()| 0),
            Command::Doctor(args) => inferscope_doctor::run_doctor(args).await,
            Command::Top(args) => inferscope_doctor::run_top(args).await.map(|()| 0),
        }
    })?;
    // Exit only after the runtime is gone, so nothing is cut off mid-write.
    drop(runtime);
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}
