//! `bench serve`: one benchmark run from arguments to report and result file.

use crate::arrivals;
use crate::cli::{Backend, BenchServeArgs, DatasetName};
use crate::client::{
    self, ApiClient, ApiKind, ClientConfig, RequestIds, RequestOutput, Sampling, discover_model,
};
use crate::dataset::{self, CountedBy, DatasetSpec, PromptSource, SampleRequest, WordSource};
use crate::error::BenchError;
use crate::html::{self, ServeReport};
use crate::progress::{self, Progress};
use crate::report::{self, ReportContext};
use crate::result_json::{self, RunMeta};
use crate::rng::Rng;
use crate::runner::{self, Plan};
use crate::server_tokenizer::{Probe, ServerTokenizer};
use crate::server_view::{self, ClientCounts, GaugeSampler, ServerView};
use crate::statistics::{self, BenchmarkMetrics, Counting, Slo};
use crate::timeline::{self, Slice};
use crate::tokenizer::{ExactSource, TextTokenizer};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The result of one run.
pub struct ServeOutcome {
    /// The figures.
    pub metrics: BenchmarkMetrics,
    /// The result JSON object (as saved).
    pub result: Map<String, Value>,
    /// Per-request measurements.
    pub outputs: Vec<RequestOutput>,
    /// Where the result was saved, if it was.
    pub saved_to: Option<PathBuf>,
    /// The server-side view (`--scrape-metrics` against a server with metrics).
    pub server_view: Option<ServerView>,
    /// The time windows (`--slice-duration`; empty without it).
    pub slices: Vec<Slice>,
}

/// Base URL from `--base-url` or `--host`/`--port`.
pub fn base_url(args: &BenchServeArgs) -> String {
    match &args.base_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!("http://{}:{}", args.host, args.port),
    }
}

fn api_and_endpoint(args: &BenchServeArgs) -> Result<(ApiKind, String), BenchError> {
    let (api, default) = match args.backend {
        Backend::Openai => (ApiKind::Completions, "/v1/completions"),
        Backend::OpenaiChat => (ApiKind::Chat, "/v1/chat/completions"),
    };
    let endpoint = args.endpoint.clone().unwrap_or_else(|| default.to_string());
    let is_chat = endpoint.trim_end_matches('/').ends_with("chat/completions");
    if is_chat != (api == ApiKind::Chat) {
        return Err(BenchError::InvalidArg(format!(
            "--backend {} does not match --endpoint {endpoint}",
            args.backend.as_str()
        )));
    }
    Ok((api, endpoint))
}

fn dataset_spec(args: &BenchServeArgs) -> Result<DatasetSpec, BenchError> {
    let path = || {
        args.dataset_path.clone().ok_or_else(|| {
            BenchError::InvalidArg("--dataset-path is required for this dataset".into())
        })
    };
    Ok(match args.dataset_name {
        DatasetName::Random => DatasetSpec::Random {
            input_len: args.random_input_len,
            output_len: args.random_output_len,
            range_ratio: args.random_range_ratio,
            prefix_len: args.random_prefix_len,
        },
        DatasetName::Sharegpt => DatasetSpec::ShareGpt {
            path: path()?,
            output_len: args.sharegpt_output_len,
        },
        DatasetName::Custom => DatasetSpec::Custom {
            path: path()?,
            output_len: args.custom_output_len,
        },
        DatasetName::PrefixRepetition => DatasetSpec::PrefixRepetition {
            prefix_len: args.prefix_repetition_prefix_len,
            suffix_len: args.prefix_repetition_suffix_len,
            num_prefixes: args.prefix_repetition_num_prefixes,
            output_len: args.prefix_repetition_output_len,
        },
    })
}

fn parse_metadata(items: &[String]) -> Result<Vec<(String, String)>, BenchError> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| {
                    BenchError::InvalidArg(format!("--metadata {kv:?}: expected KEY=VALUE"))
                })
        })
        .collect()
}

/// Sends the first request until it succeeds or the ready-check time is spent.
async fn initial_test(
    client: &ApiClient,
    req: &SampleRequest,
    ready_secs: u64,
) -> Result<(), BenchError> {
    let now = Instant::now();
    let deadline = now
        .checked_add(Duration::from_secs(ready_secs))
        .unwrap_or(now);
    loop {
        let out = client
            .send(&req.prompt, req.prompt_len, req.expected_output_len)
            .await;
        if out.success {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(BenchError::Server(format!(
                "initial test request failed: {}",
                out.error
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Draws the requests on a blocking thread (a server tokenizer blocks on its
/// calls), with a progress bar when that takes noticeable time.
async fn prepare(
    spec: &DatasetSpec,
    args: &BenchServeArgs,
    source: Arc<dyn PromptSource>,
    exact: Option<&ExactSource>,
) -> Result<(Vec<SampleRequest>, Rng), BenchError> {
    let done = exact.map_or_else(Default::default, |e| e.done.clone());
    let bar = Progress::start_after(
        "Preparing prompts ",
        "prompts",
        Duration::from_millis(500),
        args.num_prompts,
        progress::wanted(args.disable_tqdm),
        done,
    );
    let (spec, n, seed) = (spec.clone(), args.num_prompts, args.seed);
    let drawn = tokio::task::spawn_blocking(move || {
        let mut rng = Rng::new(seed);
        dataset::sample_with(&spec, n, &mut rng, source.as_ref()).map(|r| (r, rng))
    })
    .await;
    bar.finish();
    drawn.map_err(|e| BenchError::Dataset(format!("preparing prompts: {e}")))?
}

/// Counts the generated text of successful requests the server sent no
/// usage for, with the run's tokenizer.
async fn count_outputs(
    outputs: &mut [RequestOutput],
    source: Arc<dyn PromptSource>,
) -> Result<(), BenchError> {
    let todo: Vec<usize> = (0..outputs.len())
        .filter(|&i| outputs[i].success && outputs[i].usage_output_tokens.is_none())
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let texts: Vec<String> = todo
        .iter()
        .map(|&i| outputs[i].generated_text.clone())
        .collect();
    let counts = tokio::task::spawn_blocking(move || source.text_tokens(&texts))
        .await
        .map_err(|e| BenchError::Dataset(format!("counting outputs: {e}")))??;
    for (i, n) in todo.into_iter().zip(counts) {
        outputs[i].counted_output_tokens = Some(n);
    }
    Ok(())
}

/// The first distinct errors, for the console.
pub fn first_errors(outputs: &[RequestOutput], k: usize) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    for o in outputs.iter().filter(|o| !o.success) {
        if !seen.contains(&o.error) {
            seen.push(o.error.clone());
            if seen.len() == k {
                break;
            }
        }
    }
    seen
}

/// How many requests were sent again because the server had closed their
/// pooled connection before any of them was written (`None` when none was).
pub fn resent_line(outputs: &[RequestOutput]) -> Option<String> {
    let requests = outputs.iter().filter(|o| o.resent > 0).count();
    if requests == 0 {
        return None;
    }
    let times: usize = outputs.iter().map(|o| o.resent).sum();
    Some(format!(
        "{requests} requests were sent again ({times} times in all) on a new connection: the server had closed \
         the kept-alive one before any byte of them was written (it never saw them; their TTFT includes the retry)"
    ))
}

/// How long the server may take to answer a profiler call (a stop writes
/// the whole profile before it answers).
const PROFILER_ANSWER: Duration = Duration::from_secs(120);

/// `--profile`: `POST {base}/{start|stop}_profile`; the server's JSON answer
/// (`null` for an empty one, as vLLM's), or why it refused.
async fn profiler(base: &str, action: &str, api_key: Option<&str>) -> Result<Value, BenchError> {
    let url = format!("{base}/{action}_profile");
    let (status, body) = client::post_text(&url, PROFILER_ANSWER, api_key).await?;
    let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(answer);
    }
    let message = answer
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map_or_else(|| body.trim().to_string(), str::to_string);
    // vLLM answers 404 without its profiler directory; some servers 400 or 405.
    let hint = if matches!(status.as_u16(), 400 | 404 | 405) {
        " (the server was not started with --profile-dir; vLLM needs its profiler directory)"
    } else {
        ""
    };
    Err(BenchError::Server(format!(
        "--profile: POST {url}: HTTP {status}{hint}: {message}"
    )))
}

/// The line printed after the profile stopped: where the server wrote it.
fn profile_written_line(answer: &Value) -> String {
    match answer.get("path").and_then(Value::as_str) {
        Some(path) => format!(
            "Profile written by the server to {path} ({} steps, {} requests)",
            answer.get("steps").and_then(Value::as_u64).unwrap_or(0),
            answer.get("requests").and_then(Value::as_u64).unwrap_or(0)
        ),
        None => {
            "Profiler stopped (the server wrote the profile into its profile directory)".to_string()
        }
    }
}

/// Runs one benchmark: prints the report (and the server-side view) and saves
/// the result when asked.
pub async fn run_serve(args: &BenchServeArgs) -> Result<ServeOutcome, BenchError> {
    let base = base_url(args);
    let (api, endpoint) = api_and_endpoint(args)?;
    let selected = statistics::parse_metrics(&args.percentile_metrics)?;
    let percentiles = statistics::parse_percentiles(&args.metric_percentiles)?;
    let slo = Slo::parse(&args.goodput)?;
    let metadata = parse_metadata(&args.metadata)?;
    if !(args.burstiness > 0.0 && args.burstiness.is_finite()) {
        return Err(BenchError::InvalidArg(
            "--burstiness must be a positive number".into(),
        ));
    }
    if args.request_rate.is_nan() || args.request_rate <= 0.0 {
        return Err(BenchError::InvalidArg(
            "--request-rate must be positive (or inf)".into(),
        ));
    }
    if args.max_concurrency == Some(0) {
        return Err(BenchError::InvalidArg(
            "--max-concurrency must be at least 1".into(),
        ));
    }
    if args
        .slice_duration
        .is_some_and(|d| !(d > 0.0 && d.is_finite()))
    {
        return Err(BenchError::InvalidArg(
            "--slice-duration must be a positive number of seconds".into(),
        ));
    }
    if args.num_prompts == 0 {
        return Err(BenchError::InvalidArg(
            "--num-prompts must be at least 1".into(),
        ));
    }
    let tokenizer = match &args.tokenizer {
        Some(p) => Some(Arc::new(TextTokenizer::from_file(p)?)),
        None => None,
    };
    let read_timeout = Duration::try_from_secs_f64(args.request_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            BenchError::InvalidArg("--request-timeout must be a positive number of seconds".into())
        })?;
    let scrape_interval = Duration::try_from_secs_f64(args.scrape_interval)
        .ok()
        .filter(|d| *d >= Duration::from_millis(10))
        .ok_or_else(|| {
            BenchError::InvalidArg("--scrape-interval must be at least 0.01 s".into())
        })?;
    let api_key = std::env::var("OPENAI_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let model = match &args.model {
        Some(m) => m.clone(),
        None => discover_model(&base, Duration::from_secs(10), api_key.as_deref()).await?,
    };
    let spec = dataset_spec(args)?;
    let chat = api == ApiKind::Chat;
    let (exact, about) = match tokenizer {
        Some(t) => (
            Some(Arc::new(ExactSource::new(t))),
            format!(
                "exact, from {}{}",
                args.tokenizer
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string()),
                if chat {
                    " (the server's chat template not counted: an estimate of what it sees)"
                } else {
                    ""
                }
            ),
        ),
        None => match ServerTokenizer::probe(&base, &model, api_key.clone(), chat, read_timeout)
            .await?
        {
            Probe::Offered(t) => (
                Some(Arc::new(ExactSource::new(Arc::new(*t)))),
                "exact, from the server's /tokenize and /detokenize".to_string(),
            ),
            Probe::Absent(why) => (
                None,
                format!("estimated from words (no --tokenizer, and no server tokenizer: {why})"),
            ),
        },
    };
    println!("Prompt lengths: {about}");
    let source: Arc<dyn PromptSource> = match &exact {
        Some(e) => e.clone(),
        None => Arc::new(WordSource),
    };
    let counting = Counting {
        // A local tokenizer does not know the server's chat template.
        prompts: if chat && args.tokenizer.is_some() {
            CountedBy::Estimate
        } else {
            source.counted_by()
        },
        outputs: source.counted_by(),
    };
    let (requests, mut rng) = prepare(&spec, args, source.clone(), exact.as_deref()).await?;
    let client = Arc::new(ApiClient::new(ClientConfig {
        url: format!("{base}{endpoint}"),
        api,
        model: model.clone(),
        request_ids: if args.no_request_id {
            RequestIds::Off
        } else {
            RequestIds::Uuid {
                prefix: args.request_id_prefix.clone().unwrap_or_default(),
            }
        },
        ignore_eos: args.ignore_eos,
        sampling: Sampling {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            min_p: args.min_p,
            extra: args.extra_body.clone(),
        },
        read_timeout,
        api_key: api_key.clone(),
    })?);

    println!("Starting initial single prompt test run...");
    let first = requests
        .first()
        .cloned()
        .ok_or_else(|| BenchError::Dataset("no request to send".into()))?;
    initial_test(&client, &first, args.ready_check_timeout_sec).await?;
    println!("Initial test run completed.");
    // A server that closes the connection after a response does it within
    // microseconds; this lets the client see it before the run reuses it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    if client.server_closes_connections() {
        println!(
            "The server closed the test request's kept-alive connection: each request gets a connection of its own (Connection: close)"
        );
    }
    if args.num_warmups > 0 {
        println!("Warming up with {} requests...", args.num_warmups);
        let warm = Plan {
            requests: vec![first.clone(); args.num_warmups],
            offsets: vec![Duration::ZERO; args.num_warmups],
            max_concurrency: args.max_concurrency,
            progress: false,
        };
        runner::execute(client.clone(), warm).await;
    }

    let metrics_url = args
        .metrics_url
        .clone()
        .unwrap_or_else(|| format!("{base}/metrics"));
    let mut scrape_state = None;
    if args.scrape_metrics {
        match server_view::scrape(&metrics_url, api_key.as_deref()).await {
            Ok(before) => match before.namespace() {
                Some(ns) => {
                    let sampler = GaugeSampler::start(
                        metrics_url.clone(),
                        api_key.clone(),
                        ns,
                        scrape_interval,
                    );
                    scrape_state = Some((before, ns, sampler));
                }
                None => println!(
                    "--scrape-metrics: {metrics_url} has no inferscope_, inferscope: or vllm: metrics; skipping the server-side view"
                ),
            },
            Err(e) => println!(
                "--scrape-metrics: cannot read {metrics_url} ({e}); skipping the server-side view"
            ),
        }
    }

    let rate_desc = result_json::rate_str(args.request_rate);
    println!("Traffic request rate: {rate_desc}");
    println!("Burstiness factor: {}", args.burstiness);
    println!(
        "Maximum request concurrency: {}",
        args.max_concurrency
            .map_or("None".to_string(), |c| c.to_string())
    );
    let offsets = arrivals::schedule(requests.len(), args.request_rate, args.burstiness, &mut rng);
    let plan = Plan {
        requests,
        offsets,
        max_concurrency: args.max_concurrency,
        progress: progress::wanted(args.disable_tqdm),
    };
    if args.profile {
        println!("Starting the server's profiler...");
        profiler(&base, "start", api_key.as_deref()).await?;
    }
    // The runner starts its clock right after this; the server's samples are
    // put on the same axis.
    let run_start = Instant::now();
    let mut run = runner::execute(client.clone(), plan).await;
    // The report and the result are still made when the stop fails; the
    // error is returned after them.
    let mut profile_error = None;
    if args.profile {
        println!("Stopping the server's profiler...");
        match profiler(&base, "stop", api_key.as_deref()).await {
            Ok(answer) => println!("{}", profile_written_line(&answer)),
            Err(e) => {
                println!("{e}");
                profile_error = Some(e);
            }
        }
    }
    if exact.is_some()
        && let Err(e) = count_outputs(&mut run.outputs, source.clone()).await
    {
        // The run's figures are still worth having: those outputs stay
        // counted as stream events, and the report labels them estimated.
        println!("Could not count the generated text ({e})");
    }
    let m = statistics::compute(
        &run.outputs,
        run.duration_s,
        slo.as_ref(),
        &percentiles,
        counting,
    );

    if let Some(line) = resent_line(&run.outputs) {
        println!("{line}");
    }
    let errors = first_errors(&run.outputs, 5);
    if !errors.is_empty() {
        println!("{} requests failed; first errors:", m.failed);
        for e in &errors {
            println!("  {e}");
        }
    }
    let ctx = ReportContext {
        max_concurrency: args.max_concurrency,
        request_rate: args.request_rate,
        duration_s: run.duration_s,
        selected: selected.clone(),
    };
    let summary_text = report::render(&m, &ctx);
    print!("{summary_text}");
    if args.request_rate.is_finite() && args.max_concurrency.is_none() {
        let lags: Vec<f64> = run.outputs.iter().map(|o| o.send_lag).collect();
        let d = statistics::Distribution::from_seconds(&lags, &[99.0]);
        println!(
            "Client send lag behind schedule (ms): median {:.3}, p99 {:.3}",
            d.median_ms,
            d.percentiles_ms.first().map_or(0.0, |p| p.1)
        );
    }

    let slices = match args.slice_duration {
        Some(d) => timeline::slices(
            &run.outputs,
            run.duration_s,
            d,
            slo.as_ref(),
            &percentiles,
            counting,
        ),
        None => Vec::new(),
    };
    for w in &slices {
        println!(
            "Window {:>8.1} - {:>8.1} s: {} completed, {} failed, {:.2} output tok/s, median TTFT {:.2} ms, median ITL {:.2} ms",
            w.start_s,
            w.end_s,
            w.metrics.completed,
            w.metrics.failed,
            w.metrics.output_throughput,
            w.metrics.ttft.median_ms,
            w.metrics.itl.median_ms
        );
    }

    let mut server_view = None;
    let mut agreement = String::new();
    if let Some((before, ns, sampler)) = scrape_state {
        let after = server_view::scrape(&metrics_url, api_key.as_deref()).await;
        let peaks = sampler.stop(after.as_ref().ok(), ns).await;
        match after {
            Ok(after) => {
                let view = server_view::server_view(&before, &after, ns, peaks);
                let counts = ClientCounts {
                    completed: m.completed,
                    failed: m.failed,
                    output_tokens: m.total_output,
                    input_tokens: m.total_input,
                    input_exact: m.input_counted_by.is_exact(),
                    ttft_ms: (m.completed > 0).then(|| client_quantiles(&m.ttft)),
                    itl_ms: (m.completed > 0).then(|| client_quantiles(&m.itl)),
                    e2e_ms: (m.completed > 0).then(|| client_quantiles(&m.e2el)),
                };
                agreement = server_view::render(&view, &counts);
                print!("{agreement}");
                server_view = Some(view);
            }
            Err(e) => println!("--scrape-metrics: final scrape failed ({e})"),
        }
    }

    let meta = RunMeta {
        date: result_json::now_date(),
        backend: args.backend.as_str().to_string(),
        label: args.label.clone(),
        model_id: model.clone(),
        tokenizer_id: args
            .tokenizer
            .as_ref()
            .map_or(model, |p| p.display().to_string()),
        num_prompts: args.num_prompts,
        request_rate: args.request_rate,
        burstiness: args.burstiness,
        max_concurrency: args.max_concurrency,
        duration_s: run.duration_s,
        metadata,
    };
    let detailed = args.save_detailed.then_some(run.outputs.as_slice());
    let mut result = result_json::build(&meta, &m, &selected, detailed);
    if let Some(d) = args.slice_duration {
        result.insert("slice_duration".into(), serde_json::json!(d));
        result.insert(
            "slices".into(),
            result_json::slices_json(&slices, &selected),
        );
    }
    if let Some(path) = &args.report_html {
        let client_series = timeline::client_series(&run.outputs, run.duration_s);
        let server_series = server_view
            .as_ref()
            .map(|v| server_view::server_series(&v.peaks.series, run_start));
        let settings = vec![
            ("model".to_string(), meta.model_id.clone()),
            ("date".to_string(), meta.date.clone()),
            ("endpoint".to_string(), format!("{base}{endpoint}")),
            ("requests".to_string(), meta.num_prompts.to_string()),
            ("request rate (req/s)".to_string(), rate_desc.clone()),
            (
                "max concurrency".to_string(),
                meta.max_concurrency
                    .map_or("none".to_string(), |c| c.to_string()),
            ),
            ("duration (s)".to_string(), format!("{:.2}", run.duration_s)),
        ];
        let page = html::serve_report(&ServeReport {
            title: format!(
                "inferscope bench serve — {}",
                meta.label.as_deref().unwrap_or(&meta.model_id)
            ),
            settings,
            summary_text: &summary_text,
            metrics: &m,
            outputs: &run.outputs,
            duration_s: run.duration_s,
            client: &client_series,
            server: server_series.as_ref().map(|s| (s, agreement.as_str())),
            slices: args.slice_duration.map(|d| (slices.as_slice(), d)),
            percentile: percentiles.iter().copied().fold(50.0, f64::max),
        });
        write_file(path, page.as_bytes())?;
        println!("HTML report written to {}", path.display());
    }
    let mut saved_to = None;
    if args.save_result || args.save_detailed {
        let name = args
            .result_filename
            .clone()
            .unwrap_or_else(|| result_json::default_filename(&meta));
        let path = match &args.result_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
                dir.join(name)
            }
            None => PathBuf::from(name),
        };
        let text = serde_json::to_string_pretty(&result).map_err(|source| BenchError::Json {
            context: "result".into(),
            source,
        })?;
        std::fs::write(&path, text).map_err(|e| BenchError::io(&path, e))?;
        println!("Result saved to {}", path.display());
        saved_to = Some(path);
    }
    if let Some(e) = profile_error {
        return Err(e);
    }
    Ok(ServeOutcome {
        metrics: m,
        result,
        outputs: run.outputs,
        saved_to,
        server_view,
        slices,
    })
}

/// Writes a file, creating its directory.
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    }
    std::fs::write(path, bytes).map_err(|e| BenchError::io(path, e))
}

/// The client's median and, when `--metric-percentiles` asked for it, p99 (ms).
fn client_quantiles(d: &crate::statistics::Distribution) -> (f64, Option<f64>) {
    let p99 = d
        .percentiles_ms
        .iter()
        .find(|(p, _)| (*p - 99.0).abs() < 1e-9)
        .map(|&(_, v)| v);
    (d.median_ms, p99)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resends_are_counted_per_request_and_in_all() {
        let out = |resent| RequestOutput {
            resent,
            ..Default::default()
        };
        assert_eq!(resent_line(&[out(0), out(0)]), None);
        let line = resent_line(&[out(2), out(0), out(1)]).expect("a line");
        assert!(
            line.starts_with("2 requests were sent again (3 times in all)"),
            "{line}"
        );
    }
}
