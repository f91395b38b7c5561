//! The server's own tokenizer, through vLLM's `POST /tokenize` and
//! `POST /detokenize`: exact prompt lengths and counts without a local
//! `tokenizer.json`. A [`Codec`], so the fitting in
//! [`crate::tokenizer::ExactSource`] serves it as it serves a local one.
//!
//! The routes take one text (or one id list) per call; a batch is sent with
//! at most [`CONCURRENCY`] calls in flight. The codec is synchronous, like the
//! dataset code that drives it: call it from a blocking thread
//! (`tokio::task::spawn_blocking`), never from a task on the runtime.

use crate::client::{HttpClient, error_chain, http_client, parse_http_uri};
use crate::dataset::{CountedBy, WORDS};
use crate::error::BenchError;
use crate::tokenizer::Codec;
use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Most tokenizer calls in flight at once.
pub const CONCURRENCY: usize = 16;

/// What one call needs; cloned into each concurrent task.
#[derive(Clone)]
struct Endpoint {
    http: HttpClient,
    api_key: Option<String>,
    /// Longest wait for one call.
    timeout: Duration,
}

impl Endpoint {
    /// `POST uri` with a JSON body; the JSON answer, or why there is none.
    async fn post(&self, uri: &Uri, body: &Value) -> Result<Value, BenchError> {
        let mut builder =
            Request::post(uri.clone()).header(http::header::CONTENT_TYPE, "application/json");
        if let Some(key) = &self.api_key {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let req = builder
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| BenchError::InvalidArg(format!("{uri}: {e}")))?;
        let call = async {
            let resp = self
                .http
                .request(req)
                .await
                .map_err(|e| BenchError::Server(format!("POST {uri}: {}", error_chain(&e))))?;
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| BenchError::Server(format!("POST {uri}: {}", error_chain(&e))))?
                .to_bytes();
            if status != StatusCode::OK {
                let text: String = String::from_utf8_lossy(&bytes).chars().take(300).collect();
                return Err(BenchError::Server(format!(
                    "POST {uri}: HTTP {status}: {text}"
                )));
            }
            serde_json::from_slice(&bytes).map_err(|source| BenchError::Json {
                context: format!("POST {uri}"),
                source,
            })
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| {
                BenchError::Server(format!(
                    "POST {uri}: no answer within {:.1} s",
                    self.timeout.as_secs_f64()
                ))
            })?
    }
}

/// The server's tokenizer, found by [`ServerTokenizer::probe`].
pub struct ServerTokenizer {
    endpoint: Endpoint,
    tokenize: Uri,
    detokenize: Uri,
    model: String,
    /// Count prompts as chat messages (the server applies its template).
    chat: bool,
    pool: Vec<u32>,
    special: usize,
    /// Largest prompt plus output the server takes.
    pub max_model_len: Option<usize>,
    runtime: tokio::runtime::Handle,
    calls: AtomicUsize,
}

/// The answer of a probe.
pub enum Probe {
    /// The server offers both routes.
    Offered(Box<ServerTokenizer>),
    /// It does not; why.
    Absent(String),
}

fn ids_of(v: &Value, what: &str) -> Result<Vec<u32>, BenchError> {
    v.get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
        })
        .ok_or_else(|| BenchError::Server(format!("{what}: no `tokens` list of ids in {v}")))
}

fn text_of(v: &Value, what: &str) -> Result<String, BenchError> {
    v.get("prompt")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| BenchError::Server(format!("{what}: no `prompt` text in {v}")))
}

impl ServerTokenizer {
    /// Asks `base`'s `/tokenize` and `/detokenize` once each (and `/tokenize`
    /// with special tokens, to learn how many the server adds). Any failure
    /// means the server does not offer them, with the reason. Each call may
    /// take up to `timeout`.
    pub async fn probe(
        base: &str,
        model: &str,
        api_key: Option<String>,
        chat: bool,
        timeout: Duration,
    ) -> Result<Probe, BenchError> {
        let tokenize = parse_http_uri(&format!("{base}/tokenize"))?;
        let detokenize = parse_http_uri(&format!("{base}/detokenize"))?;
        let endpoint = Endpoint {
            http: http_client(),
            api_key,
            timeout,
        };
        let words = WORDS.join(" ");
        let plain = json!({"model": model, "prompt": words, "add_special_tokens": false});
        let answer = match endpoint.post(&tokenize, &plain).await {
            Ok(v) => v,
            Err(e) => return Ok(Probe::Absent(e.to_string())),
        };
        let ids = match ids_of(&answer, "POST /tokenize") {
            Ok(ids) if !ids.is_empty() => ids,
            Ok(_) => return Ok(Probe::Absent("/tokenize returned no ids".into())),
            Err(e) => return Ok(Probe::Absent(e.to_string())),
        };
        let max_model_len = answer
            .get("max_model_len")
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok());
        let back = json!({"model": model, "tokens": ids});
        if let Err(e) = endpoint
            .post(&detokenize, &back)
            .await
            .and_then(|v| text_of(&v, "POST /detokenize"))
        {
            return Ok(Probe::Absent(e.to_string()));
        }
        let with_special = json!({"model": model, "prompt": words, "add_special_tokens": true});
        let special = match endpoint.post(&tokenize, &with_special).await {
            Ok(v) => ids_of(&v, "POST /tokenize")?
                .len()
                .saturating_sub(ids.len()),
            Err(e) => return Ok(Probe::Absent(e.to_string())),
        };
        // The ids of common words decode to clean text in any vocabulary.
        let mut pool = ids;
        pool.sort_unstable();
        pool.dedup();
        Ok(Probe::Offered(Box::new(ServerTokenizer {
            endpoint,
            tokenize,
            detokenize,
            model: model.to_string(),
            chat,
            pool,
            special,
            max_model_len,
            runtime: tokio::runtime::Handle::current(),
            calls: AtomicUsize::new(0),
        })))
    }

    /// Calls made so far (the probe's not included).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    /// Posts every body to `uri`, at most [`CONCURRENCY`] at once; the
    /// answers in order. Blocks the calling (non-runtime) thread.
    fn call_all(&self, uri: &Uri, bodies: Vec<Value>) -> Result<Vec<Value>, BenchError> {
        let n = bodies.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        self.calls.fetch_add(n, Ordering::Relaxed);
        let bodies = Arc::new(bodies);
        let next = Arc::new(AtomicUsize::new(0));
        self.runtime.block_on(async {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..CONCURRENCY.min(n) {
                let (endpoint, uri, bodies, next) = (
                    self.endpoint.clone(),
                    uri.clone(),
                    bodies.clone(),
                    next.clone(),
                );
                tasks.spawn(async move {
                    let mut got = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(body) = bodies.get(i) else {
                            return Ok(got);
                        };
                        got.push((i, endpoint.post(&uri, body).await?));
                    }
                });
            }
            let mut out: Vec<Option<Value>> = vec![None; n];
            while let Some(joined) = tasks.join_next().await {
                let got: Vec<(usize, Value)> =
                    joined.map_err(|e| BenchError::Server(format!("tokenizer call: {e}")))??;
                for (i, v) in got {
                    out[i] = Some(v);
                }
            }
            out.into_iter()
                .map(|v| {
                    v.ok_or_else(|| BenchError::Server(format!("{uri}: an answer is missing")))
                })
                .collect()
        })
    }
}

impl Codec for ServerTokenizer {
    fn counted_by(&self) -> CountedBy {
        CountedBy::ServerTokenizer
    }

    fn encode(&self, texts: &[String]) -> Result<Vec<Vec<u32>>, BenchError> {
        let bodies = texts
            .iter()
            .map(|t| json!({"model": self.model, "prompt": t, "add_special_tokens": false}))
            .collect();
        self.call_all(&self.tokenize, bodies)?
            .iter()
            .map(|v| ids_of(v, "POST /tokenize"))
            .collect()
    }

    fn decode(&self, ids: &[Vec<u32>]) -> Result<Vec<String>, BenchError> {
        let bodies = ids
            .iter()
            .map(|i| json!({"model": self.model, "tokens": i}))
            .collect();
        self.call_all(&self.detokenize, bodies)?
            .iter()
            .map(|v| text_of(v, "POST /detokenize"))
            .collect()
    }

    fn pool(&self) -> &[u32] {
        &self.pool
    }

    fn special_tokens(&self) -> usize {
        self.special
    }

    fn prompt_tokens(&self, texts: &[String]) -> Result<Option<Vec<usize>>, BenchError> {
        if !self.chat {
            return Ok(None);
        }
        // The server counts the rendered conversation, template included.
        let bodies = texts
            .iter()
            .map(|t| json!({"model": self.model, "messages": [{"role": "user", "content": t}]}))
            .collect();
        let answers = self.call_all(&self.tokenize, bodies)?;
        answers
            .iter()
            .map(|v| ids_of(v, "POST /tokenize").map(|ids| ids.len()))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}
