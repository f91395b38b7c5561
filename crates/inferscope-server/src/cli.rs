//! `inferscope serve` flags, named as vLLM users know them.

use clap::{Args, Parser, ValueEnum};
use inferscope_schema::units::{parse_bytes, parse_bytes_usize};

/// Which device runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExecutorKind {
    /// A real Llama-family transformer on the CPU.
    Cpu,
    /// A simulated accelerator with a roofline cost model (load tests).
    Sim,
}

/// Flags of `inferscope serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,

    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Model: `demo` (built in), a Hugging Face model directory, or a `.gguf` file.
    /// With `--executor sim` it is only the name the model is served under.
    #[arg(long, default_value = "demo")]
    pub model: String,

    /// Names the model is served under (default: the model's name). The first one labels the metrics.
    #[arg(long, num_args = 1..)]
    pub served_model_name: Vec<String>,

    /// Device that runs the model.
    #[arg(long, value_enum, default_value_t = ExecutorKind::Cpu)]
    pub executor: ExecutorKind,

    /// Cost model of the sim executor: a built-in profile (h100-llama3-8b, h200-llama3-8b,
    /// a100-llama3-8b, tiny), optionally followed by overrides:
    /// `h100-llama3-8b,t_weights_ms=5,kv_tokens=200000` (keys t_fixed_ms, t_prefill_us,
    /// t_weights_ms, t_kv_ns, kv_tokens).
    #[arg(long, default_value = "h100-llama3-8b")]
    pub sim_profile: String,

    /// A Hugging Face `tokenizer.json` (or a directory holding one, with an optional
    /// chat template in `chat_template.jinja` or `tokenizer_config.json`) for the sim executor, so load tests see real
    /// tokenization costs and token counts (default: a byte-level tokenizer).
    #[arg(long)]
    pub tokenizer: Option<String>,

    /// The chat template, replacing the model's: a file, or the Jinja text itself when no
    /// file by that name exists (then `\n` and the like are decoded), as vLLM's flag.
    #[arg(long)]
    pub chat_template: Option<String>,

    /// Serve `tool_choice: "auto"` (vLLM's flag): the model's output is read into
    /// `tool_calls` by --tool-call-parser. Without it, a request with `tools` and `tool_choice`
    /// `auto` (the default when `tools` is given) gets 400.
    #[arg(long, requires = "tool_call_parser")]
    pub enable_auto_tool_choice: bool,

    /// How the model writes tool calls (vLLM's parser names): `hermes` (Hermes 2 Pro, Qwen 2.5
    /// and 3: `<tool_call>{"name", "arguments"}</tool_call>`), `llama3_json` (Llama 3.1/3.2:
    /// `{"name", "parameters"}`, optionally after `<|python_tag|>`, several separated by `;`),
    /// `mistral` (`[TOOL_CALLS][{"name", "arguments"}, ...]` or `[TOOL_CALLS]name[ARGS]{...}`),
    /// `pythonic` (Llama 3.2/4, ToolACE: `[get_weather(city="Paris"), now()]`).
    #[arg(long, value_parser = ["hermes", "llama3_json", "mistral", "pythonic"])]
    pub tool_call_parser: Option<String>,

    /// With `tool_choice: "none"`, leave the tools out of the chat template (vLLM's flag; by
    /// default the template sees them, and nothing is parsed).
    #[arg(long)]
    pub exclude_tools_when_tool_choice_none: bool,

    /// Engine cores in this process (data parallelism).
    #[arg(long, default_value_t = 1)]
    pub data_parallel_size: usize,

    /// Global rank of this server's first engine, so several servers' engine labels never collide.
    #[arg(long, default_value_t = 0)]
    pub data_parallel_rank: usize,

    /// Cap on sequences in one engine's running batch.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,

    /// Token budget of one engine step, prefill chunks plus decodes; at
    /// least --max-num-seqs (default: 256 for cpu, at least --max-num-seqs;
    /// 8192 for sim).
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,

    /// Tokens per KV-cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,

    /// Longest prompt plus output (default: the model's limit; 8192 for sim).
    #[arg(long)]
    pub max_model_len: Option<usize>,

    /// Reuse KV blocks across requests with a common prefix (on by default).
    #[arg(long, overrides_with = "no_enable_prefix_caching")]
    pub enable_prefix_caching: bool,

    /// Turn prefix caching off.
    #[arg(long)]
    pub no_enable_prefix_caching: bool,

    /// KV-cache memory per engine core (cpu executor; default: a fraction of free memory):
    /// bytes or a size such as 512MiB, 1GiB, 2G.
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub kv_cache_memory: Option<u64>,

    /// Weight storage of the cpu executor's dense weights: auto (a Hugging Face
    /// checkpoint's bfloat16 or float16, as its config.json says; float32 otherwise;
    /// GGUF tensors keep their stored types), float32, bfloat16 or float16 (16 bits:
    /// half the memory and bytes read per token; computation stays f32).
    #[arg(long, default_value = "auto", value_parser = ["auto", "float32", "float", "bfloat16", "bf16", "float16", "half", "f16"])]
    pub dtype: String,

    /// Threads of each engine core's cpu executor (default: one per core, shared by
    /// all engines), as llama-server's flag.
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,

    /// Where the cpu executor saves a GGUF file's repacked weights, for later
    /// starts to map in place instead of repacking them (one file per model file,
    /// as large as its repacked weights; replaced when the model file or the
    /// inferscope build changes). Default: $INFERSCOPE_CACHE_DIR/packed, else
    /// $XDG_CACHE_HOME/inferscope/packed, else ~/.cache/inferscope/packed.
    #[arg(long, value_name = "DIR")]
    pub packed_weights_cache_dir: Option<std::path::PathBuf>,

    /// Repack a GGUF file's weights at every start, neither reading nor writing the
    /// packed-weights cache.
    #[arg(long, conflicts_with = "packed_weights_cache_dir")]
    pub no_packed_weights_cache: bool,

    /// Sampling defaults for requests that omit a field: auto (the model's
    /// generation_config.json, or a GGUF file's general.sampling.* keys), vllm (none:
    /// temperature 1, top_p 1), or a folder holding a generation_config.json, as vLLM's flag.
    #[arg(long, default_value = "auto", value_name = "auto|vllm|FOLDER")]
    pub generation_config: String,

    /// Sampling defaults laid over --generation-config, as a JSON object with
    /// generation_config.json's names: '{"temperature": 0.5, "max_new_tokens": 256}'.
    #[arg(long, value_name = "JSON")]
    pub override_generation_config: Option<String>,
    /// KV-cache element type of the cpu executor (vLLM's flag): auto (= float16), float16,
    /// bfloat16 or float32. 16-bit halves the bytes per token, so `--kv-cache-memory` holds
    /// twice the tokens of float32; attention converts each row as it reads it.
    #[arg(long, default_value = "auto", value_parser = ["auto", "float16", "fp16", "bfloat16", "bf16", "float32", "fp32"])]
    pub kv_cache_dtype: String,

    /// Require `Authorization: Bearer KEY` on /v1/* routes.
    #[arg(long, env = "INFERSCOPE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// Tenants: `--api-key-file`, `--tenant-header`, `--trusted-proxy`,
    /// `--max-tenant-labels`.
    #[command(flatten)]
    pub tenants: inferscope_tenants::TenantArgs,

    /// How the engines admit waiting requests: fair (across tenants, in
    /// proportion to their weights; FCFS within a tenant) or fcfs (arrival
    /// order, whoever sent the request).
    #[arg(long, alias = "scheduling", default_value = "fair", value_parser = ["fair", "fcfs"])]
    pub scheduling_policy: String,

    /// Seconds between the periodic per-engine stats log lines.
    #[arg(long, default_value_t = 10.0)]
    pub log_stats_interval: f64,

    /// Do not log the periodic stats lines.
    #[arg(long)]
    pub disable_log_stats: bool,

    /// Do not record or serve engine and request metrics (`/metrics` answers 404).
    #[arg(long)]
    pub disable_metrics: bool,

    /// Do not serve the browser console (`/`, `/console`, `/console/api/*`) nor keep
    /// its short history (see docs/console.md).
    #[arg(long)]
    pub disable_console: bool,

    /// Let a request ask for its own timings (`"include_metrics": true`): they come
    /// back as `metrics` in the response (the final chunk when streaming), and as
    /// TGI's `x-queue-time`, `x-inference-time`, `x-time-per-token` and `x-total-time`
    /// headers (milliseconds) on non-streaming responses. Without this flag
    /// `include_metrics` is ignored.
    #[arg(long)]
    pub enable_per_request_metrics: bool,

    /// Serve `GET /tokenizer_info` (vLLM's flag): the tokenizer's configuration
    /// (class, BOS/EOS strings, whether BOS is added, `model_max_length`, chat template),
    /// which clients such as lm-evaluation-harness's remote tokenizer read. Without
    /// it the route answers 404, as vLLM's.
    #[arg(long)]
    pub enable_tokenizer_info_endpoint: bool,

    /// Write one JSON line per finished request (ids, trace id, engine, timings,
    /// tokens, finish reason) to PATH (appended) or to stderr (`-`, the default
    /// when no value is given). Lines the writer cannot keep up with are dropped and
    /// counted in `request_log_dropped`.
    #[arg(long, value_name = "PATH|-", num_args = 0..=1, default_missing_value = "-")]
    pub enable_request_log: Option<String>,

    /// Namespace of the engine metrics (`NS_name`); `vllm` gives vLLM's exact
    /// names (`vllm:name`) and default buckets for existing dashboards.
    #[arg(long, default_value = "inferscope")]
    pub metrics_namespace: String,

    /// Time the residency of a sample of KV blocks: serve the
    /// `kv_block_lifetime_seconds`, `kv_block_idle_before_evict_seconds` and
    /// `kv_block_reuse_gap_seconds` histograms (vLLM's flag).
    #[arg(long)]
    pub kv_cache_metrics: bool,

    /// Fraction (0 < F <= 1) of allocated KV blocks `--kv-cache-metrics` times.
    #[arg(long, default_value_t = 0.01, value_name = "F")]
    pub kv_cache_metrics_sample: f64,

    /// Serve `estimated_flops_per_gpu_total` and the estimated read / write
    /// bytes, from the executor's cost model, for model FLOPs utilisation
    /// (vLLM's flag; the sim executor has a cost model).
    #[arg(long)]
    pub enable_mfu_metrics: bool,

    /// Serve `moe_expert_tokens_total{expert}`: the tokens a mixture-of-experts
    /// model (cpu executor) routes to each expert, one series per expert.
    #[arg(long)]
    pub expert_metrics: bool,

    /// Override a histogram bucket group: `GROUP=b1,b2,...` with GROUP one of
    /// time_to_first_token, inter_token_latency, request_latency, request_tokens,
    /// iteration_tokens. Repeatable.
    #[arg(long = "histogram-buckets", value_name = "GROUP=BUCKETS")]
    pub histogram_buckets: Vec<String>,

    /// Refuse requests with 429 while this many are already waiting (over all engines).
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,

    /// Refuse requests with 429 while this many prompt tokens are admitted but not yet
    /// started (no first token yet), over all engines. A request is always admitted
    /// when nothing is queued, so one long prompt cannot be locked out for ever.
    #[arg(long)]
    pub max_queued_tokens: Option<usize>,

    /// Threads that parse, render chat templates and tokenize requests, off the async
    /// runtime so a long prompt cannot stall other streams (like TGI's --validation-workers).
    /// Each takes up to one core from the engine while busy.
    #[arg(long, default_value_t = 2)]
    pub validation_workers: usize,

    /// Threads each engine core computes structured-output (grammar) masks on,
    /// while the step runs; a step's constrained sequences are spread over them.
    /// Default: the machine's cores, at most 8. Raise it when `doctor` reports
    /// `grammar_masks` (the device waits for masks).
    #[arg(long, value_name = "N")]
    pub grammar_threads: Option<usize>,

    /// Bytes of request bodies that may be held by requests being validated or waiting for a
    /// validation worker (at most 4 GiB); more get 429 rather than piling up in memory.
    /// Bytes or a size such as 256MiB.
    #[arg(long, default_value = "256MiB", value_name = "SIZE", value_parser = parse_bytes_usize)]
    pub max_validation_queue_bytes: usize,

    /// Most stop strings (`stop`) in one request; more get 400. Each output
    /// delta of each choice is searched for every one of them.
    #[arg(long, default_value_t = 16)]
    pub max_stop_sequences: usize,

    /// Longest stop string in bytes; longer ones get 400.
    #[arg(long, default_value_t = 256)]
    pub max_stop_sequence_bytes: usize,

    /// Most stop token ids (`stop_token_ids`, duplicates counted) in one request; more get 400.
    #[arg(long, default_value_t = 256)]
    pub max_stop_token_ids: usize,

    /// Most log-probabilities per position a request may ask for
    /// (`logprobs`, `top_logprobs`, `prompt_logprobs`); more get 400 (vLLM's flag).
    #[arg(long, default_value_t = 20)]
    pub max_logprobs: usize,

    /// Which logits reported log-probabilities come from: the model's raw
    /// ones (`raw_logprobs`, vLLM's default) or those the draw uses, after
    /// penalties, `logit_bias`, temperature and top-k/top-p/min-p
    /// (`processed_logprobs`).
    #[arg(long, default_value = "raw_logprobs", value_parser = ["raw_logprobs", "processed_logprobs"])]
    pub logprobs_mode: String,

    /// Largest request body (larger ones get 413): bytes or a size such as 16MiB.
    #[arg(long, default_value = "16MiB", value_name = "SIZE", value_parser = parse_bytes_usize)]
    pub max_request_body_bytes: usize,

    /// Seconds in-flight requests may take to finish on shutdown before they are aborted.
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,

    /// Serve `/metrics` on a separate listener at this address (default: `--host`) instead
    /// of the API port, so the metrics need not face the public. Needs `--metrics-port`.
    #[arg(long, requires = "metrics_port")]
    pub metrics_host: Option<String>,

    /// Port of the separate `/metrics` listener (0 picks a free one). When set, the API
    /// port answers 404 on `/metrics`.
    #[arg(long)]
    pub metrics_port: Option<u16>,

    /// Export an OpenTelemetry trace of each sampled request (span `llm_request` with phase
    /// children) to this OTLP collector: over HTTP/protobuf by default (a URL without a path gets
    /// `/v1/traces`), over gRPC when OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc. OTEL_SERVICE_NAME,
    /// OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_[TRACES_]HEADERS, OTEL_TRACES_SAMPLER[_ARG] and
    /// OTEL_BSP_* apply. Responses then carry a `traceparent` header.
    #[arg(long, value_name = "URL")]
    pub otlp_traces_endpoint: Option<String>,

    /// Fraction of requests to trace, 0 to 1: the same as OTEL_TRACES_SAMPLER=parentbased_traceidratio
    /// with OTEL_TRACES_SAMPLER_ARG=RATIO, and it overrides both. Parent-based: a request whose
    /// `traceparent` is marked sampled is traced whatever the ratio. Default: every request
    /// (or what OTEL_TRACES_SAMPLER says).
    #[arg(long, value_name = "RATIO", requires = "otlp_traces_endpoint")]
    pub otlp_traces_sample_ratio: Option<f64>,
    /// Publish KV-cache events for prefix-aware routers, as vLLM does: JSON with vLLM's keys,
    /// e.g. `{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
    /// "replay_endpoint": "tcp://*:5558", "topic": "kv@POD_IP@MODEL"}` (also enables
    /// `GET /debug/kv_cache_blocks` and `POST /reset_prefix_cache`).
    #[arg(long, value_name = "JSON")]
    pub kv_events_config: Option<String>,

    /// Serve vLLM's `POST /start_profile` and `POST /stop_profile` (behind the API key):
    /// between them the engines record every step and request, and the stop writes a
    /// Trace Event Format file (Perfetto, chrome://tracing) into DIR, created if missing
    /// (docs/console.md). Without it the routes answer 404.
    #[arg(long, value_name = "DIR")]
    pub profile_dir: Option<std::path::PathBuf>,

    /// Test only: every Nth step of each sim executor fails (its requests end with `error`).
    #[arg(long, hide = true, default_value_t = 0)]
    pub sim_fail_every_n_steps: u64,

    /// Test only: each sim executor dies after this many steps (its engine core stops).
    #[arg(long, hide = true, default_value_t = 0)]
    pub sim_die_after_steps: u64,

    /// Test only: inject the sim faults into this engine (global index) alone.
    #[arg(long, hide = true)]
    pub sim_fault_engine: Option<usize>,
}

/// The cpu executor's default step budget. A CPU prefills a few hundred
/// tokens a second, so a burst of prompts in one 8192-token step would hold
/// every first token (and every running stream) for seconds; 256-token
/// chunks let the burst's first tokens out in turn. Measured against 512,
/// 128 and 8192 in docs/results/cpu-executor.md ("the cpu step budget", 2 Dec 2026).
pub const CPU_MAX_NUM_BATCHED_TOKENS: usize = 256;

/// The sim executor's default step budget (vLLM's on large GPUs).
pub const SIM_MAX_NUM_BATCHED_TOKENS: usize = 8192;

impl ServeArgs {
    /// The step token budget: `--max-num-batched-tokens`, else the
    /// executor's default (on cpu never below `--max-num-seqs`, so the
    /// default does not cap the decode batch).
    pub fn max_num_batched_tokens(&self) -> usize {
        self.max_num_batched_tokens.unwrap_or(match self.executor {
            ExecutorKind::Cpu => CPU_MAX_NUM_BATCHED_TOKENS.max(self.max_num_seqs),
            ExecutorKind::Sim => SIM_MAX_NUM_BATCHED_TOKENS,
        })
    }

    /// Whether prefix caching is on.
    pub fn prefix_caching(&self) -> bool {
        !self.no_enable_prefix_caching
    }

    /// Parses flags as `inferscope serve` would (tests, embedding).
    pub fn try_parse_flags<I, T>(flags: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: ServeArgs,
        }
        let argv = std::iter::once(std::ffi::OsString::from("serve"))
            .chain(flags.into_iter().map(Into::into));
        Wrapper::try_parse_from(argv).map(|w| w.args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_flags_take_sizes() {
        let a = ServeArgs::try_parse_flags([
            "--kv-cache-memory",
            "1GiB",
            "--max-request-body-bytes",
            "512KiB",
            "--max-validation-queue-bytes",
            "2G",
        ])
        .expect("sizes");
        assert_eq!(a.kv_cache_memory, Some(1 << 30));
        assert_eq!(a.max_request_body_bytes, 512 << 10);
        assert_eq!(a.max_validation_queue_bytes, 2_000_000_000);
        let a = ServeArgs::try_parse_flags(["--kv-cache-memory", "1048576"]).expect("bytes");
        assert_eq!(a.kv_cache_memory, Some(1 << 20));
        let e = ServeArgs::try_parse_flags(["--kv-cache-memory", "1 lightyear"])
            .expect_err("not a size")
            .to_string();
        assert!(
            e.contains("--kv-cache-memory") && e.contains("512MiB"),
            "{e}"
        );
    }

    #[test]
    fn defaults_match_the_ecosystem() {
        let a = ServeArgs::try_parse_flags::<[&str; 0], &str>([]).expect("defaults");
        assert_eq!(a.port, 8000);
        assert_eq!(a.model, "demo");
        assert_eq!(a.executor, ExecutorKind::Cpu);
        assert_eq!(
            (a.max_num_seqs, a.max_num_batched_tokens(), a.block_size),
            (256, 256, 16)
        );
        assert!(a.prefix_caching());
        assert_eq!(
            (a.validation_workers, a.max_validation_queue_bytes),
            (2, 256 << 20)
        );
        let a = ServeArgs::try_parse_flags(["--no-enable-prefix-caching", "--executor", "sim"])
            .expect("flags");
        assert!(!a.prefix_caching());
        assert_eq!(a.max_num_batched_tokens(), 8192);
        let budget = |flags: &[&str]| {
            ServeArgs::try_parse_flags(flags)
                .expect("flags")
                .max_num_batched_tokens()
        };
        assert_eq!(budget(&["--max-num-seqs", "512"]), 512);
        assert_eq!(budget(&["--max-num-seqs", "8"]), 256);
        assert_eq!(
            budget(&["--executor", "sim", "--max-num-batched-tokens", "100"]),
            100
        );
        assert_eq!(budget(&["--max-num-batched-tokens", "4096"]), 4096);
        assert!(ServeArgs::try_parse_flags(["--executor", "gpu"]).is_err());
        let a = ServeArgs::try_parse_flags::<[&str; 0], &str>([]).expect("defaults");
        assert!(!a.kv_cache_metrics && !a.enable_mfu_metrics);
        assert_eq!(a.kv_cache_metrics_sample, 0.01);
    }
}
