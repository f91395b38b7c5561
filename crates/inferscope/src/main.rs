//! The `inferscope` binary: one CLI for the server and its tools.

mod chat_template;

use std::io::IsTerminal;

use clap::{Parser, Subcommand, ValueEnum};
use inferscope_bench::BenchCommand;
use inferscope_doctor::{DoctorArgs, TopArgs};
use inferscope_proxy::ProxyArgs;
use inferscope_server::ServeArgs;

/// inferscope: an LLM inference server with first-class observability.
#[derive(Parser)]
#[command(name = "inferscope", version, about)]
struct Cli {
    /// Log format on stderr: `text` for people, `json` (one object per line with
    /// timestamp, level, target and fields, the message among them) for log shippers.
    #[arg(long, global = true, value_enum, env = "INFERSCOPE_LOG_FORMAT", default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines; coloured only on a terminal and without `NO_COLOR`.
    Text,
    /// JSON lines.
    Json,
}

/// Colour only for a person at a terminal, and never when `NO_COLOR` is set
/// to anything non-empty (<https://no-color.org>): log files and pipes get
/// plain text, not escape sequences.
fn use_colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber: `RUST_LOG` filter (default `info`), stderr.
fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(use_colour(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR"),
            ))
            .init(),
        LogFormat::Json => {
            builder.json().with_ansi(false).init();
            // The default hook prints a panic as plain text, which would be
            // the one line a log shipper cannot parse: log it as an event.
            std::panic::set_hook(Box::new(|info| {
                let location = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()))
                    .unwrap_or_default();
                let payload = info.payload();
                let message = payload
                    .downcast_ref::<&str>()
                    .copied()
                    .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("a panic without a message");
                let thread = std::thread::current();
                let thread = thread.name().unwrap_or("unnamed");
                tracing::error!(target: "panic", %location, thread, "panicked: {message}");
            }));
        }
    }
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
    /// Reverse proxy that gives any OpenAI-compatible server (llama.cpp, Ollama, vLLM) these metrics.
    Proxy(Box<ProxyArgs>),
    /// Render a conversation with a model's chat template (or `--chat-template`), as `serve` does.
    ChatTemplate(chat_template::ChatTemplateArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    if matches!(cli.command, Command::Serve(_)) {
        inferscope_server::limit_allocator_arenas();
    }
    // The console's findings are the doctor's rules, which the server and
    // proxy crates may not link: handed in here.
    let diagnose: inferscope_server::Diagnose =
        std::sync::Arc::new(inferscope_doctor::console_findings);
    let code = match cli.command {
        // The proxy runs its own runtimes, one current-thread runtime per thread.
        Command::Proxy(args) => inferscope_proxy::run(*args, Some(diagnose)).map(|()| 0)?,
        Command::Serve(args) => on_runtime(async {
            Ok(inferscope_server::run(*args, Some(diagnose))
                .await
                .map(|()| 0)?)
        })?,
        Command::Bench(cmd) => on_runtime(async { inferscope_bench::run(cmd).await.map(|()| 0) })?,
        Command::Doctor(args) => on_runtime(inferscope_doctor::run_doctor(args))?,
        Command::Top(args) => {
            on_runtime(async { inferscope_doctor::run_top(args).await.map(|()| 0) })?
        }
        Command::ChatTemplate(args) => chat_template::run(args).map(|()| 0)?,
    };
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// Runs `work` on a multi-threaded runtime, and returns only after the runtime
/// is gone, so nothing is cut off mid-write when the process exits.
fn on_runtime<F: std::future::Future<Output = anyhow::Result<i32>>>(
    work: F,
) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let code = runtime.block_on(work);
    drop(runtime);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(
            use_colour(true, Some("".into())),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_colour(true, Some("1".into())));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some("1".into())));
    }
}
