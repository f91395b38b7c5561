//! The HTTP layer on a small axum router, driven in-process with `oneshot`.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body::Frame;
use http_body_util::BodyExt;
use inferscope_metrics::{Format, MetricsConfig, StatLoggerManager};
use inferscope_schema::promtext::{Exposition, check_histograms, parse};
use tokio::sync::mpsc;
use tower::{Layer, ServiceExt};

/// A response body fed by a channel, so tests control when bytes flow.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

fn app(m: &StatLoggerManager, stream_rx: Option<mpsc::Receiver<Bytes>>) -> Router {
    let stream_rx = std::sync::Arc::new(parking_lot::Mutex::new(stream_rx));
    Router::new()
        .route(
            "/v1/completions",
            post(|body: String| async move { format!("echo:{body}") }),
        )
        .route("/v1/models/{id}", get(|| async { "model" }))
        .route(
            "/stream",
            get(move || {
                let rx = stream_rx.lock().take();
                async move {
                    match rx {
                        Some(rx) => Body::new(ChannelBody(rx)),
                        None => Body::empty(),
                    }
                }
            }),
        )
        .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .route(
            "/status/{code}",
            get(
                |axum::extract::Path(code): axum::extract::Path<u16>| async move {
                    StatusCode::from_u16(code).unwrap()
                },
            )
            .post(|| async { "posted" }),
        )
        .route("/metrics", get(|| async { "metrics" }))
        .route("/health", get(|| async { "ok" }))
        .layer(m.http_layer())
}

fn manager() -> StatLoggerManager {
    StatLoggerManager::new(MetricsConfig::default()).unwrap()
}

fn scrape(m: &StatLoggerManager) -> (Exposition, String) {
    let (_, body) = m.render(Format::Prometheus);
    let e = parse(&body).unwrap_or_else(|err| panic!("{err}\n{body}"));
    check_histograms(&e).unwrap_or_else(|err| panic!("{err}\n{body}"));
    (e, body)
}

async fn send(router: &Router, req: Request<Body>) -> (StatusCode, Bytes) {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

/// One route's requests land in the series of their own status class and
/// method, whichever came first (the layer resolves each route's series
/// once and keeps them).
#[tokio::test]
async fn one_route_counts_each_status_class_and_method_apart() {
    let m = manager();
    let router = app(&m, None);
    for (method, code) in [
        ("GET", 200),
        ("GET", 404),
        ("POST", 200),
        ("GET", 200),
        ("GET", 503),
        ("GET", 404),
        ("GET", 404),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(format!("/status/{code}"))
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&router, req).await.0.as_u16(), code);
    }
    let (e, body) = scrape(&m);
    for (method, status, count) in [
        ("GET", "2xx", 2.0),
        ("GET", "4xx", 3.0),
        ("GET", "5xx", 1.0),
        ("POST", "2xx", 1.0),
    ] {
        let labels = [
            ("handler", "/status/{code}"),
            ("method", method),
            ("status", status),
        ];
        assert_eq!(
            e.value("http_requests_total", &labels),
            Some(count),
            "{method} {status}\n{body}"
        );
    }
    let handler = [("handler", "/status/{code}")];
    assert_eq!(
        e.value("http_response_size_bytes_count", &handler),
        Some(7.0),
        "{body}"
    );
    for (method, count) in [("GET", 6.0), ("POST", 1.0)] {
        let labels = [("handler", "/status/{code}"), ("method", method)];
        assert_eq!(
            e.value("http_request_duration_seconds_count", &labels),
            Some(count),
            "{method}\n{body}"
        );
        assert_eq!(
            e.value("http_requests_inprogress", &labels),
            Some(0.0),
            "{method}\n{body}"
        );
    }
}

#[tokio::test]
async fn labels_by_route_template() {
    let m = manager();
    let router = app(&m, None);
    let req = Request::post("/v1/completions")
        .header("content-length", "5")
        .body(Body::from("hello"))
        .unwrap();
    let (status, body) = send(&router, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"echo:hello");
    for id in ["a", "b", "c"] {
        let req = Request::get(format!("/v1/models/{id}"))
            .body(Body::empty())
            .unwrap();
        send(&router, req).await;
    }
    send(&router, Request::get("/fail").body(Body::empty()).unwrap()).await;

    let (e, body) = scrape(&m);
    let completions = [
        ("handler", "/v1/completions"),
        ("method", "POST"),
        ("status", "2xx"),
    ];
    assert_eq!(
        e.value("http_requests_total", &completions),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        e.value(
            "http_requests_total",
            &[
                ("handler", "/v1/models/{id}"),
                ("method", "GET"),
                ("status", "2xx")
            ]
        ),
        Some(3.0)
    );
    assert_eq!(
        e.value(
            "http_requests_total",
            &[("handler", "/fail"), ("status", "5xx")]
        ),
        Some(1.0)
    );
    let h = [("handler", "/v1/completions")];
    assert_eq!(e.value("http_request_size_bytes_sum", &h), Some(5.0));
    assert_eq!(e.value("http_response_size_bytes_sum", &h), Some(10.0));
    assert_eq!(
        e.value(
            "http_request_duration_seconds_count",
            &[("handler", "/v1/completions"), ("method", "POST")]
        ),
        Some(1.0)
    );
    assert_eq!(
        e.value("http_request_duration_highr_seconds_count", &[]),
        Some(5.0)
    );
    assert_eq!(
        e.value(
            "http_requests_inprogress",
            &[("handler", "/v1/completions"), ("method", "POST")]
        ),
        Some(0.0)
    );
    assert!(
        !body.contains("/v1/models/a"),
        "raw paths never become labels"
    );
}

#[tokio::test]
async fn request_without_content_length_is_counted() {
    let m = manager();
    let router = app(&m, None);
    let req = Request::post("/v1/completions")
        .body(Body::from("abcdefg"))
        .unwrap();
    assert!(req.headers().get("content-length").is_none());
    send(&router, req).await;
    let (e, _) = scrape(&m);
    assert_eq!(
        e.value(
            "http_request_size_bytes_sum",
            &[("handler", "/v1/completions")]
        ),
        Some(7.0)
    );
}

#[tokio::test]
async fn random_paths_share_one_series() {
    let m = manager();
    let router = app(&m, None);
    send(
        &router,
        Request::get("/v1/models/x").body(Body::empty()).unwrap(),
    )
    .await;
    let (before, _) = scrape(&m);
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..1000 {
        // xorshift: deterministic pseudo-random paths.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let path = format!("/scan/{i}/{state:x}");
        let (status, _) = send(&router, Request::get(path).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (after, body) = scrape(&m);
    assert_eq!(
        after.value(
            "http_requests_total",
            &[("handler", "none"), ("method", "GET"), ("status", "4xx")]
        ),
        Some(1000.0),
        "{body}"
    );
    // Every HTTP series still has one of the two handlers seen before the scan.
    let handlers: std::collections::BTreeSet<&str> = after
        .samples()
        .filter(|s| s.name.starts_with("http_"))
        .filter_map(|s| s.labels.get("handler").map(String::as_str))
        .collect();
    assert_eq!(
        handlers.into_iter().collect::<Vec<_>>(),
        ["/v1/models/{id}", "none"]
    );
    assert_eq!(
        after.series_count("http_requests_total"),
        before.series_count("http_requests_total") + 1
    );
    assert!(!body.contains("/scan/"));
}

#[tokio::test]
async fn excluded_paths_are_not_recorded() {
    let m = manager();
    let router = app(&m, None);
    for p in ["/metrics", "/health"] {
        let (status, _) = send(&router, Request::get(p).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (e, body) = scrape(&m);
    assert_eq!(e.series_count("http_requests_total"), 0, "{body}");
    assert_eq!(
        e.value("http_request_duration_highr_seconds_count", &[]),
        Some(0.0)
    );

    let m = manager();
    let router = Router::new()
        .route("/health", get(|| async { "ok" }))
        .layer(m.http_layer().with_excluded(Vec::<String>::new()));
    send(
        &router,
        Request::get("/health").body(Body::empty()).unwrap(),
    )
    .await;
    let (e, _) = scrape(&m);
    assert_eq!(
        e.value("http_requests_total", &[("handler", "/health")]),
        Some(1.0)
    );
}

#[tokio::test]
async fn streaming_body_records_at_the_last_byte() {
    let m = manager();
    let (tx, rx) = mpsc::channel(4);
    let router = app(&m, Some(rx));
    let resp = router
        .clone()
        .oneshot(Request::get("/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let labels = [("handler", "/stream"), ("method", "GET")];
    let (e, _) = scrape(&m);
    assert_eq!(e.value("http_requests_inprogress", &labels), Some(1.0));
    assert_eq!(
        e.value("http_requests_total", &labels),
        None,
        "not done yet"
    );

    let mut body = resp.into_body();
    tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap().len(), 9);
    tx.send(Bytes::from_static(b"data: [DONE]\n\n"))
        .await
        .unwrap();
    body.frame().await.unwrap().unwrap();
    let (e, _) = scrape(&m);
    assert_eq!(
        e.value("http_requests_total", &labels),
        None,
        "stream still open"
    );
    drop(tx);
    assert!(body.frame().await.is_none());

    let (e, body_text) = scrape(&m);
    assert_eq!(
        e.value("http_requests_total", &labels),
        Some(1.0),
        "{body_text}"
    );
    assert_eq!(e.value("http_requests_inprogress", &labels), Some(0.0));
    assert_eq!(
        e.value("http_response_size_bytes_sum", &[("handler", "/stream")]),
        Some(23.0)
    );
    assert_eq!(
        e.value("http_request_duration_seconds_count", &labels),
        Some(1.0)
    );
}

#[tokio::test]
async fn body_dropped_early_still_records() {
    let m = manager();
    let (tx, rx) = mpsc::channel(4);
    let router = app(&m, Some(rx));
    let resp = router
        .clone()
        .oneshot(Request::get("/stream").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let mut body = resp.into_body();
    tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
    body.frame().await.unwrap().unwrap();
    // The client goes away: hyper drops the body mid-stream.
    drop(body);
    let labels = [("handler", "/stream"), ("method", "GET")];
    let (e, _) = scrape(&m);
    assert_eq!(e.value("http_requests_total", &labels), Some(1.0));
    assert_eq!(e.value("http_requests_inprogress", &labels), Some(0.0));
    assert_eq!(
        e.value("http_response_size_bytes_sum", &[("handler", "/stream")]),
        Some(9.0)
    );
    drop(tx);
}

#[tokio::test]
async fn invented_methods_share_one_label() {
    let m = manager();
    let router = app(&m, None);
    for method in ["BREW", "WHEN", "PROPFIND"] {
        let req = Request::builder()
            .method(method)
            .uri("/v1/models/x")
            .body(Body::empty())
            .unwrap();
        send(&router, req).await;
    }
    let (e, body) = scrape(&m);
    assert_eq!(
        e.value(
            "http_requests_total",
            &[("handler", "/v1/models/{id}"), ("method", "other")]
        ),
        Some(3.0),
        "{body}"
    );
}

#[tokio::test]
async fn client_disconnect_over_tcp_records() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let m = manager();
    let (tx, rx) = mpsc::channel(1);
    let router = app(&m, Some(rx));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(b"GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    tx.send(Bytes::from_static(b"data: 1\n\n")).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(7).any(|w| w == b"data: 1") {
        let n = sock.read(&mut buf).await.unwrap();
        assert!(n > 0, "server closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    let labels = [("handler", "/stream"), ("method", "GET")];
    assert_eq!(scrape(&m).0.value("http_requests_total", &labels), None);
    drop(sock);
    // Keep the stream producing until the server notices the disconnect and
    // drops the body (the channel then closes); bounded so it cannot hang.
    let mut sends = 0;
    while tx.send(Bytes::from_static(b"data: x\n\n")).await.is_ok() {
        sends += 1;
        assert!(sends < 2000, "server never dropped the body");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (e, body) = scrape(&m);
    assert_eq!(e.value("http_requests_total", &labels), Some(1.0), "{body}");
    assert_eq!(e.value("http_requests_inprogress", &labels), Some(0.0));
    server.abort();
}

#[tokio::test]
async fn a_service_outside_a_router_is_labelled_by_its_route_template() {
    let m = manager();
    let svc = m
        .http_layer()
        .layer(tower::service_fn(|_req: Request<_>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
        }));
    let mut req = Request::post("/v1/chat/completions?x=1")
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(inferscope_metrics::http::RouteTemplate(
            "/v1/chat/completions",
        ));
    let resp = svc.clone().oneshot(req).await.unwrap();
    resp.into_body().collect().await.unwrap();
    // Without one (and no router), the request matched no route.
    let req = Request::post("/v1/chat/completions")
        .body(Body::empty())
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    resp.into_body().collect().await.unwrap();

    let (e, body) = scrape(&m);
    let labels = |handler| [("handler", handler), ("method", "POST"), ("status", "2xx")];
    assert_eq!(
        e.value("http_requests_total", &labels("/v1/chat/completions")),
        Some(1.0),
        "{body}"
    );
    assert_eq!(
        e.value("http_requests_total", &labels("none")),
        Some(1.0),
        "{body}"
    );
}

/// `call_route`: the route and start are the caller's, as a
/// `RouteTemplate` and `RequestStart` would give them; nothing is read from
/// (or needed in) the extensions.
#[tokio::test]
async fn a_request_can_be_handed_its_route_and_start() {
    let m = manager();
    let mut svc = m
        .http_layer()
        .layer(tower::service_fn(|_req: Request<_>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::from("ok")))
        }));
    let started = std::time::Instant::now() - std::time::Duration::from_millis(300);
    let req = Request::post("/v1/completions")
        .header("content-length", "0")
        .body(Body::empty())
        .unwrap();
    assert!(req.extensions().is_empty());
    let resp = svc
        .call_route(req, "/v1/completions", started)
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();
    let (e, body) = scrape(&m);
    let labels = [
        ("handler", "/v1/completions"),
        ("method", "POST"),
        ("status", "2xx"),
    ];
    assert_eq!(e.value("http_requests_total", &labels), Some(1.0), "{body}");
    let duration = e
        .value("http_request_duration_seconds_sum", &labels[..2])
        .expect("a duration");
    assert!(
        duration >= 0.3,
        "timed from the given start: {duration}\n{body}"
    );
}
