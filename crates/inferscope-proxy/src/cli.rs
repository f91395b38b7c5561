//! `inferscope proxy`'s flags.

use clap::{Args, Parser};
use inferscope_schema::units::parse_bytes_usize;

/// Flags of `inferscope proxy`.
#[derive(Debug, Clone, Args)]
#[command(
    about = "Reverse proxy in front of any OpenAI-compatible server (llama.cpp, Ollama, vLLM, ...): \
             the same /metrics as `inferscope serve`, measured from what the client sees",
    after_help = "Example:\n  inferscope proxy --upstream http://127.0.0.1:8080 --port 8001 \\\n      \
                  --upstream-metrics http://127.0.0.1:8080/metrics\n\
                  then point clients at http://HOST:8001/v1 and Prometheus at http://HOST:8001/metrics.\n\
                  Series only an engine knows (queue time, KV-cache usage, device time, steps) are absent."
)]
pub struct ProxyArgs {
    /// Base URL of the upstream server, `http://host:port` (a trailing `/v1` is accepted).
    #[arg(long, env = "INFERSCOPE_UPSTREAM", value_name = "URL")]
    pub upstream: String,

    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8001)]
    pub port: u16,

    /// The models to keep series for (`model_name` label), comma-separated
    /// or repeated; requests for other models are labelled `other`. Default:
    /// the models the upstream lists at `/v1/models` when the proxy starts
    /// (at most 32). With one model, every request is labelled with it.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub served_model_name: Vec<String>,

    /// Require clients to send `Authorization: Bearer KEY` (the header is still
    /// passed upstream unless `--upstream-api-key` replaces it); tenant `default`.
    #[arg(long, env = "INFERSCOPE_API_KEY", value_name = "KEY")]
    pub api_key: Option<String>,

    /// Tenants: `--api-key-file`, `--tenant-header`, `--trusted-proxy`,
    /// `--max-tenant-labels`.
    #[command(flatten)]
    pub tenants: inferscope_tenants::TenantArgs,

    /// Generation requests in flight to the upstream at once; beyond it they
    /// wait at the proxy in per-tenant queues, admitted in proportion to the
    /// tenants' weights (arrival order within a tenant). Default: no bound.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_upstream_concurrency: Option<u32>,

    /// Serve no console (`/console`: the live page of the requests the proxy
    /// measured, docs/console.md) and keep no history for it.
    #[arg(long)]
    pub disable_console: bool,

    /// Send `Authorization: Bearer KEY` to the upstream instead of the client's header.
    #[arg(long, env = "INFERSCOPE_UPSTREAM_API_KEY", value_name = "KEY")]
    pub upstream_api_key: Option<String>,

    /// The upstream's own metrics (e.g. `http://127.0.0.1:8080/metrics`): scraped
    /// on each scrape of the proxy's `/metrics` and appended unchanged (families
    /// whose names the proxy itself exposes are left out).
    #[arg(long, value_name = "URL")]
    pub upstream_metrics: Option<String>,

    /// Namespace of the proxy's engine-level metrics (`inferscope`, or `vllm`
    /// for dashboards that expect vLLM's names).
    #[arg(long, default_value = "inferscope")]
    pub metrics_namespace: String,

    /// Upper end of the 1-2-5 token-count buckets (prompt and generation
    /// tokens per request); the upstream's context length is a good value.
    #[arg(long, default_value_t = 32768, value_name = "TOKENS")]
    pub max_model_len: usize,

    /// Seconds to wait for a TCP connection to the upstream (then 504).
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub connect_timeout: f64,

    /// Seconds to wait for the upstream's response headers (then 504).
    #[arg(long, default_value_t = 600.0, value_name = "SECS")]
    pub upstream_timeout: f64,

    /// Largest request body accepted on the generation routes (then 413): bytes
    /// or a size such as 32MiB.
    #[arg(long, default_value = "32MiB", value_name = "SIZE", value_parser = parse_bytes_usize)]
    pub max_request_body: usize,

    /// Do not add `stream_options.include_usage` to streamed requests (for an
    /// upstream that refuses the field); streams then carry token counts only
    /// when the client asks for usage itself.
    #[arg(long)]
    pub no_usage_injection: bool,

    /// Threads serving clients, each with its own event loop and upstream
    /// connections (default: one per CPU).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

impl ProxyArgs {
    /// Parses `inferscope proxy` flags (without the program and subcommand name).
    pub fn try_parse_flags<I, T>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ProxyArgs,
        }
        let argv = std::iter::once(std::ffi::OsString::from("proxy"))
            .chain(flags.into_iter().map(Into::into));
        Wrapper::try_parse_from(argv).map(|w| w.args)
    }
}
