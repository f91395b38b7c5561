//! The HTTP ceiling of the request path: a bare axum handler on the same
//! runtime and socket settings as `inferscope serve` (a multi-threaded tokio
//! runtime, TCP_NODELAY) that reads the body and answers every
//! `POST /v1/completions` with one canned 16-token completion. Nothing else:
//! no validation, engine, metrics or logging. `scripts/request-path.sh`
//! measures the server against it on the same pinned core.
//!
//! Run: `cargo run --release -p inferscope-server --example bare_axum -- [PORT]`
//! (default 18200).

use axum::Router;
use axum::body::Bytes;
use axum::http::header;
use axum::routing::post;
use axum::serve::ListenerExt;

/// What the server answers for `{"prompt":"hello world","max_tokens":16}`
/// with the sim executor, in shape and size.
const COMPLETION: &str = r#"{"id":"cmpl-5f0c4a4b2d1e4f8a9b7c6d5e4f3a2b1c","object":"text_completion","created":1764442626,"model":"m","choices":[{"index":0,"text":" the quick brown fox jumps over the lazy dog and then some more words","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":2,"total_tokens":18,"completion_tokens":16}}"#;

async fn completion(_body: Bytes) -> ([(header::HeaderName, &'static str); 1], &'static str) {
    ([(header::CONTENT_TYPE, "application/json")], COMPLETION)
}

fn main() -> std::io::Result<()> {
    let port: u16 = match std::env::args().nth(1) {
        Some(p) => p
            .parse()
            .map_err(|e| std::io::Error::other(format!("bad port `{p}`: {e}")))?,
        None => 18200,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await?
                .tap_io(|tcp| {
                    let _ = tcp.set_nodelay(true);
                });
            let app = Router::new().route("/v1/completions", post(completion));
            axum::serve(listener, app).await
        })
}
