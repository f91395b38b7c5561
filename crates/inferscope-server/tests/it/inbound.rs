//! The server's client connections (`inferscope_inbound`), spoken to over raw
//! sockets: requests pipelined on one connection, heads and bodies cut
//! across reads, what the inbound path leaves to hyper (chunked bodies,
//! `Expect`, HTTP/1.0, malformed heads, bodies over the limit), and a
//! `Content-Length` that does not match the body.

use std::net::SocketAddr;
use std::time::Duration;

use inferscope_test_support::{
    RawConn, raw_chunked_post, raw_post, send_malformed_heads, send_mismatched_lengths,
};
use serde_json::Value;

use crate::common::{Sample, scrape, start, sum};

const COMPLETION: &str = r#"{"model":"m","prompt":"a b","max_tokens":4,"ignore_eos":true}"#;
const STREAM: &str =
    r#"{"model":"m","prompt":"a b","max_tokens":4,"ignore_eos":true,"stream":true}"#;
const CHAT: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true}"#;

/// `http_requests_total` for one route and status class.
fn http_requests(samples: &[Sample], handler: &str, status: &str) -> f64 {
    sum(
        samples,
        "http_requests_total",
        &[("handler", handler), ("status", status)],
    )
}

/// Finished engine requests, any reason.
fn finished(samples: &[Sample]) -> f64 {
    sum(samples, "inferscope_request_success_total", &[])
}

/// The completion tokens a non-streamed answer reports.
fn completion_tokens(body: &str) -> u64 {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["usage"]["completion_tokens"].as_u64().expect("usage")
}

/// The SSE stream ends with `[DONE]`.
fn assert_done(body: &str) {
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
}

async fn server() -> inferscope_server::RunningServer {
    start(&[
        "--served-model-name",
        "m",
        "--max-request-body-bytes",
        "4096",
    ])
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_share_one_connection() {
    let server = server().await;
    let mut c = RawConn::open(server.addr).await;
    // Three requests in one write: answered in order, each whole.
    let mut three = raw_post("/v1/completions", COMPLETION, "");
    three.extend(raw_post("/v1/completions", STREAM, ""));
    three.extend(raw_post("/v1/chat/completions", CHAT, ""));
    c.send(&three).await;
    let json = c.reply().await.expect("the first answer");
    assert_eq!(json.status, 200, "{}", json.body);
    assert!(json.header("date").is_some(), "a date header, as hyper's");
    assert_eq!(json.header("content-type"), Some("application/json"));
    assert_eq!(completion_tokens(&json.body), 4);
    let streamed = c.reply().await.expect("the second answer");
    assert_eq!(streamed.status, 200, "{}", streamed.body);
    assert!(
        streamed
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream"))
    );
    assert_done(&streamed.body);
    let chat = c.reply().await.expect("the third answer");
    assert_eq!(completion_tokens(&chat.body), 3);
    // Another route on the same connection goes to the router.
    c.send(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let models = c.reply().await.expect("the models");
    assert_eq!(models.status, 200, "{}", models.body);
    assert!(models.body.contains("\"m\""), "{}", models.body);
    c.send(&raw_post("/v1/completions", COMPLETION, "")).await;
    assert_eq!(c.reply().await.expect("a post after the GET").status, 200);

    let samples = scrape(server.addr).await;
    assert_eq!(http_requests(&samples, "/v1/completions", "2xx"), 3.0);
    assert_eq!(http_requests(&samples, "/v1/chat/completions", "2xx"), 1.0);
    assert_eq!(http_requests(&samples, "/v1/models", "2xx"), 1.0);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_and_a_body_cut_across_reads() {
    let server = server().await;
    let mut c = RawConn::open(server.addr).await;
    let whole = raw_post("/v1/completions", COMPLETION, "");
    // Cuts inside the request line, inside the head, at its end and inside
    // the body.
    let head_end = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut from = 0;
    for to in [7, 30, head_end, head_end + 10, whole.len()] {
        c.send(&whole[from..to]).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        from = to;
    }
    let r = c.reply().await.expect("a reply");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(completion_tokens(&r.body), 4);
    let samples = scrape(server.addr).await;
    let size_sum = sum(
        &samples,
        "http_request_size_bytes_sum",
        &[("handler", "/v1/completions")],
    );
    assert_eq!(size_sum, COMPLETION.len() as f64, "the request's size");
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_inbound_path_leaves_to_hyper_is_answered_as_before() {
    let server = server().await;
    let addr: SocketAddr = server.addr;
    // Malformed heads: hyper's 400, and the connection closes.
    send_malformed_heads(addr).await;
    // A chunked body, after a request the inbound path served on the same
    // connection: hyper reads the rest of the connection.
    let mut c = RawConn::open(addr).await;
    c.send(&raw_post("/v1/completions", COMPLETION, "")).await;
    assert_eq!(c.reply().await.expect("the first").status, 200);
    c.send(&raw_chunked_post("/v1/completions", STREAM)).await;
    let r = c.reply().await.expect("the stream");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_done(&r.body);
    c.send(&raw_post("/v1/completions", COMPLETION, "")).await;
    assert_eq!(c.reply().await.expect("one more").status, 200);
    // `Expect: 100-continue`: hyper's interim answer, then the response.
    let mut c = RawConn::open(addr).await;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        COMPLETION.len()
    );
    c.send(head.as_bytes()).await;
    while !c
        .read_so_far()
        .starts_with(b"HTTP/1.1 100 Continue\r\n\r\n")
    {
        assert!(c.fill().await, "the interim answer");
    }
    assert_eq!(c.reply().await.expect("100").status, 100);
    c.send(COMPLETION.as_bytes()).await;
    assert_eq!(c.reply().await.expect("the answer").status, 200);
    // HTTP/1.0: answered, then closed.
    let mut c = RawConn::open(addr).await;
    let old = format!(
        "POST /v1/completions HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{COMPLETION}",
        COMPLETION.len()
    );
    c.send(old.as_bytes()).await;
    let r = c.reply().await.expect("an HTTP/1.0 answer");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(completion_tokens(&r.body), 4);
    assert!(c.closed().await, "HTTP/1.0 without keep-alive closes");
    // Over --max-request-body-bytes: the router's 413, as for any request.
    let mut c = RawConn::open(addr).await;
    let big = format!(
        r#"{{"model":"m","prompt":"{}","max_tokens":1}}"#,
        "a ".repeat(3000)
    );
    c.send(&raw_post("/v1/completions", &big, "")).await;
    let r = c.reply().await.expect("413");
    assert_eq!(r.status, 413, "{}", r.body);
    let samples = scrape(addr).await;
    assert_eq!(http_requests(&samples, "/v1/completions", "2xx"), 5.0);
    assert_eq!(http_requests(&samples, "/v1/completions", "4xx"), 1.0);
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_that_does_not_match_the_body() {
    let server = server().await;
    let first = send_mismatched_lengths(server.addr, "/v1/completions", COMPLETION).await;
    assert_eq!(completion_tokens(&first.body), 4);
    // The short body was refused before the engine saw it.
    let samples = scrape(server.addr).await;
    assert_eq!(http_requests(&samples, "/v1/completions", "4xx"), 1.0);
    assert_eq!(http_requests(&samples, "/v1/completions", "2xx"), 1.0);
    assert_eq!(finished(&samples), 1.0, "only the whole request ran");
    server.shutdown(Duration::from_secs(5)).await;
}
