//! The generation posts skip axum's router (`router::Front`, the main
//! listener's service): the same requests sent through the router answer
//! alike and count alike in the HTTP metrics.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::{call, scrape, start, sum};
use inferscope_server::RunningServer;

/// `server`'s state served by the plain router (as before the front), on a
/// listener of its own.
async fn routed(server: &RunningServer, max_body: usize) -> SocketAddr {
    let app = inferscope_server::router::router(server.state.clone(), max_body, true, None)
        .into_make_service_with_connect_info::<SocketAddr>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

/// A body without what differs between two answers to the same request
/// (ids, timestamps, the engine's timings).
fn comparable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        for k in ["id", "created", "metrics"] {
            o.remove(k);
        }
    }
    v
}

/// `http_requests_total` for one route, method and status class.
async fn count(addr: SocketAddr, route: &str, method: &str, status: &str) -> f64 {
    sum(
        &scrape(addr).await,
        "http_requests_total",
        &[("handler", route), ("method", method), ("status", status)],
    )
}

/// A request: method, path, body and headers.
type Case<'a> = (&'a str, &'a str, String, Vec<(&'a str, &'a str)>);

/// Sends `(method, path, body, headers)` to both services in turn; each
/// answer must match the other's and move the same series by one.
async fn same_through_both(front: SocketAddr, router: SocketAddr, cases: &[Case<'_>]) {
    for (method, path, body, headers) in cases {
        let mut answers = Vec::new();
        for addr in [front, router] {
            let r = call(addr, method, path, body, headers).await;
            let class = format!("{}xx", r.status / 100);
            // The layer counts a response once its last byte is written.
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let before = answers.len() as f64;
            let route = if r.status == 404 { "none" } else { *path };
            while count(front, route, method, &class).await < before + 1.0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{method} {path} ({}) was not counted under {route}",
                    r.status
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let body = serde_json::from_str(&r.body)
                .map(comparable)
                .unwrap_or(Value::String(r.body.clone()));
            let has_id = r.headers.contains_key("x-request-id");
            answers.push((
                r.status,
                r.headers.get("content-type").cloned(),
                has_id,
                body,
            ));
        }
        let shown: String = body.chars().take(80).collect();
        assert_eq!(
            answers[0], answers[1],
            "{method} {path} {shown}: front, then router"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_generation_routes_answer_alike_without_the_router() {
    let server = start(&["--max-request-body-bytes", "4096"]).await;
    let router = routed(&server, 4096).await;
    let json = vec![("content-type", "application/json")];
    let completion = json!({"prompt": "hi", "max_tokens": 4, "temperature": 0}).to_string();
    let chat =
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0})
            .to_string();
    let cases = vec![
        ("POST", "/v1/completions", completion.clone(), json.clone()),
        ("POST", "/v1/chat/completions", chat, json.clone()),
        (
            "POST",
            "/v1/completions",
            json!({"prompt": "x", "n": 0}).to_string(),
            json.clone(),
        ),
        ("POST", "/v1/completions", "{not json".into(), json.clone()),
        ("POST", "/v1/completions", "z".repeat(5000), json.clone()),
        ("POST", "/v1/chat/completions", "z".repeat(5000), vec![]),
        ("GET", "/v1/completions", String::new(), vec![]),
        ("POST", "/v1/completions/", completion, json.clone()),
    ];
    same_through_both(server.addr, router, &cases).await;
    server.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_key_is_checked_alike_without_the_router() {
    let server = start(&["--api-key", "sesame"]).await;
    let router = routed(&server, 1 << 20).await;
    let body = json!({"prompt": "hi", "max_tokens": 2, "temperature": 0}).to_string();
    let json = ("content-type", "application/json");
    let cases = vec![
        ("POST", "/v1/completions", body.clone(), vec![json]),
        (
            "POST",
            "/v1/completions",
            body.clone(),
            vec![json, ("authorization", "Bearer wrong")],
        ),
        (
            "POST",
            "/v1/chat/completions",
            body.clone(),
            vec![json, ("authorization", "Bearer sesame")],
        ),
        (
            "POST",
            "/v1/completions",
            body,
            vec![json, ("authorization", "Bearer sesame")],
        ),
    ];
    same_through_both(server.addr, router, &cases).await;
    server.shutdown(Duration::from_secs(5)).await;
}
