//! The proxy's HTTP/1.1 inbound path (`inferscope_inbound`), spoken to over raw sockets: heads
//! and bodies split across reads, keep-alive, a request the fast path does
//! not take after one it does (hyper's turn, with the bytes already read),
//! malformed heads, and a `Content-Length` that does not match the body.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use inferscope_proxy::RunningProxy;
use inferscope_schema::promtext::{self, Exposition};
use inferscope_schema::schema;
use inferscope_test_support::{
    RawConn as Conn, raw_chunked_post, raw_post as post, send_malformed_heads,
    send_mismatched_lengths,
};

const NS: &str = "inferscope";

async fn proxy(upstream: SocketAddr) -> RunningProxy {
    common::proxy(&format!("http://{upstream}"), &["--served-model-name", "m"]).await
}

async fn serve() -> inferscope_server::RunningServer {
    common::serve(&["--sim-profile", "tiny", "--served-model-name", "m"]).await
}

const STREAM: &str =
    r#"{"model":"m","prompt":"a b","max_tokens":4,"ignore_eos":true,"stream":true}"#;
const CHAT: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"ignore_eos":true}"#;

async fn scrape(addr: SocketAddr) -> Exposition {
    let mut c = Conn::open(addr).await;
    c.send(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let r = c.reply().await.expect("a reply");
    assert_eq!(r.status, 200, "{}", r.body);
    promtext::parse(&r.body).unwrap_or_else(|e| panic!("{e}\n{}", r.body))
}

fn http_requests(e: &Exposition, handler: &str, status: &str) -> f64 {
    promtext::sum(
        e.samples(),
        &schema::HTTP_REQUESTS.exposed_name(""),
        &[("handler", handler), ("method", "POST"), ("status", status)],
    )
}

fn finished(e: &Exposition) -> f64 {
    promtext::sum(e.samples(), &schema::REQUEST_SUCCESS.exposed_name(NS), &[])
}

/// SSE payloads, `[DONE]` last.
fn data_lines(body: &str) -> Vec<&str> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect()
}

/// Checks a streamed `STREAM` completion as the client got it, whole: JSON
/// chunks, only the last finishing (for `length`), then `[DONE]`. Not how
/// many chunks: a sampled token that decodes to no text sends none (the sim
/// samples from the request's random id), so four tokens can come in three.
fn assert_whole_stream(body: &str) {
    let events = data_lines(body);
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    let chunks: Vec<serde_json::Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("a JSON chunk"))
        .collect();
    assert!((1..=4).contains(&chunks.len()), "{body}");
    let finish: Vec<&serde_json::Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .collect();
    assert_eq!(
        finish.last().copied(),
        Some(&serde_json::json!("length")),
        "{body}"
    );
    assert!(
        finish[..finish.len() - 1].iter().all(|f| f.is_null()),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_posts_and_then_a_get_share_one_connection() {
    let server = serve().await;
    let p = proxy(server.addr).await;
    let mut c = Conn::open(p.addr).await;

    c.send(&post("/v1/completions", STREAM, "")).await;
    let streamed = c.reply().await.expect("the stream");
    assert_eq!(streamed.status, 200);
    assert!(
        streamed
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/event-stream"))
    );
    assert!(streamed.header("date").is_some(), "hyper's date header");
    assert_whole_stream(&streamed.body);
    assert!(
        !streamed.body.contains("\"usage\""),
        "the injected usage is taken out"
    );

    // The second request goes out on the same connection, non-streamed.
    c.send(&post("/v1/chat/completions", CHAT, "")).await;
    let json = c.reply().await.expect("the second response");
    assert_eq!(json.status, 200, "{}", json.body);
    assert_eq!(
        json.header("content-length").map(str::to_owned),
        Some(json.body.len().to_string())
    );
    let v: serde_json::Value = serde_json::from_str(&json.body).expect("json");
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // A GET on the same connection (read here too, answered by the router).
    c.send(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let models = c.reply().await.expect("the models");
    assert_eq!(models.status, 200, "{}", models.body);
    assert!(models.body.contains("\"m\""), "{}", models.body);
    // And a generation post after it still works.
    c.send(&post("/v1/completions", STREAM, "")).await;
    let again = c.reply().await.expect("a post after the GET");
    assert_whole_stream(&again.body);

    let px = scrape(p.addr).await;
    assert_eq!(http_requests(&px, "/v1/completions", "2xx"), 2.0);
    assert_eq!(http_requests(&px, "/v1/chat/completions", "2xx"), 1.0);
    assert_eq!(finished(&px), 3.0);
    let gen_tokens = promtext::sum(
        px.samples(),
        &schema::GENERATION_TOKENS.exposed_name(NS),
        &[],
    );
    assert_eq!(gen_tokens, 11.0);
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_and_a_body_split_across_reads() {
    let server = serve().await;
    let p = proxy(server.addr).await;
    let mut c = Conn::open(p.addr).await;
    let whole = post("/v1/completions", STREAM, "");
    // Cuts inside the request line, inside the head, at the head's end and
    // inside the body.
    let head_end = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let cuts = [7, 30, head_end, head_end + 10, whole.len()];
    let mut from = 0;
    for to in cuts {
        c.send(&whole[from..to]).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        from = to;
    }
    let r = c.reply().await.expect("a reply");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_whole_stream(&r.body);
    let px = scrape(p.addr).await;
    assert_eq!(http_requests(&px, "/v1/completions", "2xx"), 1.0);
    let size_sum = promtext::sum(
        px.samples(),
        &format!("{}_sum", schema::HTTP_REQUEST_SIZE.exposed_name("")),
        &[("handler", "/v1/completions")],
    );
    assert_eq!(
        size_sum,
        STREAM.len() as f64,
        "request size from Content-Length"
    );
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_or_unusual_heads_get_hypers_answers() {
    let server = serve().await;
    let p = proxy(server.addr).await;
    send_malformed_heads(p.addr).await;
    // A chunked request body is not the fast path's: hyper reads it.
    let mut c = Conn::open(p.addr).await;
    c.send(&raw_chunked_post("/v1/completions", STREAM)).await;
    let r = c.reply().await.expect("the stream");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_whole_stream(&r.body);
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_content_length_that_does_not_match_the_body() {
    let server = serve().await;
    let p = proxy(server.addr).await;

    // The short body is refused before anything goes upstream.
    let first = send_mismatched_lengths(p.addr, "/v1/completions", STREAM).await;
    assert_whole_stream(&first.body);
    let px = scrape(p.addr).await;
    assert_eq!(http_requests(&px, "/v1/completions", "4xx"), 1.0);
    assert_eq!(http_requests(&px, "/v1/completions", "2xx"), 1.0);
    assert_eq!(finished(&px), 1.0, "only the whole request ran");
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_ends_the_upstream_request_as_an_abort() {
    // 200 tokens at 20 ms a step: 4 s unless the upstream request is ended.
    let server = common::serve(&[
        "--sim-profile",
        "tiny,t_fixed_ms=20",
        "--served-model-name",
        "m",
    ])
    .await;
    let p = proxy(server.addr).await;
    let mut c = Conn::open(p.addr).await;
    c.send(&post(
        "/v1/completions",
        r#"{"model":"m","prompt":"go","max_tokens":200,"ignore_eos":true,"stream":true}"#,
        "",
    ))
    .await;
    while !String::from_utf8_lossy(c.read_so_far()).contains("data: {") {
        assert!(c.fill().await, "the stream started");
    }
    let gone = std::time::Instant::now();
    drop(c);
    let abort = |e: &Exposition| {
        promtext::sum(
            e.samples(),
            &schema::REQUEST_SUCCESS.exposed_name(NS),
            &[("finished_reason", "abort")],
        )
    };
    loop {
        let s = scrape(server.addr).await;
        if abort(&s) == 1.0 {
            break;
        }
        assert!(
            gone.elapsed() < Duration::from_secs(2),
            "the upstream request went on after the client left"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let px = scrape(p.addr).await;
    assert_eq!(abort(&px), 1.0);
    assert_eq!(finished(&px), 1.0);
    p.shutdown(Duration::from_secs(1)).await;
    server.shutdown(Duration::from_secs(1)).await;
}
