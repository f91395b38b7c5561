//! Command-line arguments, with the names and defaults of `vllm bench serve`.

use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

/// `inferscope bench …`
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Benchmark online serving throughput and latency against a running server.
    Serve(Box<BenchServeArgs>),
    /// Show two result JSON files side by side, with the change of every figure.
    Compare(CompareArgs),
    /// Run `serve` at several request rates or concurrency levels; table and plots.
    Sweep(Box<SweepArgs>),
}

/// Request format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// `/v1/completions`.
    Openai,
    /// `/v1/chat/completions`.
    OpenaiChat,
}

impl Backend {
    /// The name as typed on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Openai => "openai",
            Backend::OpenaiChat => "openai-chat",
        }
    }
}

/// Dataset kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// Random prompts of given lengths.
    Random,
    /// ShareGPT conversations (JSON).
    Sharegpt,
    /// JSON Lines with a `prompt` field.
    Custom,
    /// Shared prefixes with random suffixes.
    PrefixRepetition,
}

/// Arguments of `bench serve`.
#[derive(Debug, Clone, Args)]
pub struct BenchServeArgs {
    /// Request format.
    #[arg(long, value_enum, default_value_t = Backend::Openai)]
    pub backend: Backend,
    /// Server base URL (e.g. http://127.0.0.1:8000); overrides --host/--port.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Server host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Server port.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// API path (default: /v1/completions, or /v1/chat/completions for openai-chat).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// Model name (default: the first model of GET /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    /// Path to a tokenizer.json for exact prompt lengths and output counts.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Dataset.
    #[arg(long, value_enum, default_value_t = DatasetName::Random)]
    pub dataset_name: DatasetName,
    /// Dataset file (sharegpt, custom).
    #[arg(long)]
    pub dataset_path: Option<PathBuf>,
    /// Input tokens per request (random).
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: usize,
    /// Output tokens per request (random).
    #[arg(long, default_value_t = 128)]
    pub random_output_len: usize,
    /// Lengths uniform in [len·(1−r), len·(1+r)] (random).
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Shared prefix tokens before each random prompt.
    #[arg(long, default_value_t = 0)]
    pub random_prefix_len: usize,
    /// Fixed output length for ShareGPT (default: the reply's length).
    #[arg(long)]
    pub sharegpt_output_len: Option<usize>,
    /// Output length for custom lines without `output_tokens`.
    #[arg(long, default_value_t = 256)]
    pub custom_output_len: usize,
    /// Tokens per shared prefix (prefix-repetition).
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_prefix_len: usize,
    /// Tokens per random suffix (prefix-repetition).
    #[arg(long, default_value_t = 256)]
    pub prefix_repetition_suffix_len: usize,
    /// Number of distinct prefixes (prefix-repetition).
    #[arg(long, default_value_t = 10)]
    pub prefix_repetition_num_prefixes: usize,
    /// Output tokens (prefix-repetition).
    #[arg(long, default_value_t = 128)]
    pub prefix_repetition_output_len: usize,
    /// Number of requests.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// Requests per second; inf sends all at once.
    #[arg(long, default_value_t = f64::INFINITY)]
    pub request_rate: f64,
    /// Gamma shape of inter-arrival gaps (1 = Poisson; lower = burstier).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight at once.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Send ignore_eos: true (exact output lengths).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Prefix of each request's `x-request-id` (PREFIX + a random UUID).
    #[arg(long, value_name = "PREFIX", conflicts_with = "no_request_id")]
    pub request_id_prefix: Option<String>,
    /// Send no `x-request-id` header (default: a random UUID per request).
    #[arg(long)]
    pub no_request_id: bool,
    /// Sampling temperature sent with each request (default: 0, greedy).
    #[arg(long)]
    pub temperature: Option<f64>,
    /// top_p sent with each request (default: the server's).
    #[arg(long)]
    pub top_p: Option<f64>,
    /// top_k sent with each request (default: the server's).
    #[arg(long)]
    pub top_k: Option<i64>,
    /// min_p sent with each request (default: the server's).
    #[arg(long)]
    pub min_p: Option<f64>,
    /// A JSON object merged into every request body, last (vLLM's
    /// `--extra-body`), e.g. `'{"guided_choice": ["yes", "no"]}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_json_object)]
    pub extra_body: Option<serde_json::Map<String, serde_json::Value>>,
    /// Warm-up requests before the run (not measured).
    #[arg(long, default_value_t = 0)]
    pub num_warmups: usize,
    /// Metrics with percentiles: ttft, tpot, itl, e2el.
    #[arg(long, default_value = "ttft,tpot,itl")]
    pub percentile_metrics: String,
    /// Percentiles to report, comma-separated.
    #[arg(long, default_value = "99")]
    pub metric_percentiles: String,
    /// SLOs for goodput: ttft:MS tpot:MS e2el:MS.
    #[arg(long, num_args = 1..)]
    pub goodput: Vec<String>,
    /// Save the result JSON.
    #[arg(long)]
    pub save_result: bool,
    /// Include per-request data in the result JSON.
    #[arg(long)]
    pub save_detailed: bool,
    /// Directory of the result JSON.
    #[arg(long)]
    pub result_dir: Option<PathBuf>,
    /// File name of the result JSON.
    #[arg(long)]
    pub result_filename: Option<String>,
    /// Label of the run (result file name prefix).
    #[arg(long)]
    pub label: Option<String>,
    /// Extra key=value pairs for the result JSON.
    #[arg(long, num_args = 1..)]
    pub metadata: Vec<String>,
    /// Hide the progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
    /// Fail a request after this many seconds without data from the server.
    #[arg(long, default_value_t = 300.0)]
    pub request_timeout: f64,
    /// Retry the initial test request for up to this many seconds (0 = one try).
    #[arg(long, default_value_t = 0)]
    pub ready_check_timeout_sec: u64,
    /// Read the server's /metrics before, during and after the run.
    #[arg(long)]
    pub scrape_metrics: bool,
    /// Metrics URL (default: BASE_URL/metrics).
    #[arg(long)]
    pub metrics_url: Option<String>,
    /// Gauge sampling interval during the run, seconds.
    #[arg(long, default_value_t = 0.5)]
    pub scrape_interval: f64,
    /// Profile the run on the server (vLLM's `--profile`): `POST /start_profile`
    /// before it and `POST /stop_profile` after; the server must have been
    /// started with its profile directory (inferscope: `--profile-dir`).
    #[arg(long)]
    pub profile: bool,
    /// Write a self-contained HTML report (tables and charts, no network needed to view it).
    #[arg(long, value_name = "FILE")]
    pub report_html: Option<PathBuf>,
    /// Also report every figure per time window of this many seconds (requests
    /// belong to the window of their send time), in the JSON and the HTML.
    #[arg(long, value_name = "SECONDS")]
    pub slice_duration: Option<f64>,
}

/// Arguments of `bench compare`.
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The "before" result JSON.
    pub a: PathBuf,
    /// The "after" result JSON.
    pub b: PathBuf,
}

/// Arguments of `bench sweep`.
#[derive(Debug, Clone, Args)]
pub struct SweepArgs {
    /// The serve arguments shared by every point.
    #[command(flatten)]
    pub serve: BenchServeArgs,
    /// Request rates to run, comma-separated (inf allowed).
    #[arg(long, value_delimiter = ',')]
    pub request_rates: Vec<f64>,
    /// Concurrency levels to run, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub max_concurrencies: Vec<usize>,
    /// Where to write the table JSON and plots (default: --result-dir or .).
    #[arg(long)]
    pub plot_dir: Option<PathBuf>,
}

/// A JSON object (`--extra-body`).
fn parse_json_object(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}
