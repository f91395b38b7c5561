//! The upstream side: the base URL, the pooled HTTP/1 client (TCP_NODELAY),
//! header forwarding, and upstream failures as OpenAI error bodies (502, 504).

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderMap, HeaderValue};
use http::{StatusCode, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;

use crate::ProxyError;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1), plus
/// `host`, which the client sets from the upstream URL.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// An `http://host:port[/prefix]` base URL, validated once at start-up.
#[derive(Debug, Clone)]
pub struct BaseUrl {
    /// `http://host:port/prefix` without a trailing slash.
    base: String,
}

impl BaseUrl {
    /// Parses `url`; a trailing `/v1` is dropped (clients' paths carry it).
    pub fn parse(url: &str) -> Result<Self, ProxyError> {
        let bad = |reason: &str| ProxyError::Upstream {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|_| bad("not a URL (expected http://host:port)"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(bad(
                    "https is not supported: run the proxy beside the server and use http",
                ));
            }
            _ => return Err(bad("expected http://host:port")),
        }
        let authority = uri.authority().ok_or_else(|| bad("no host in the URL"))?;
        if uri.query().is_some() {
            return Err(bad("a base URL takes no query string"));
        }
        let path = uri.path().trim_end_matches('/');
        let path = path.strip_suffix("/v1").unwrap_or(path);
        Ok(Self {
            base: format!("http://{authority}{path}"),
        })
    }

    /// The upstream URI of a client's path and query.
    pub fn join(&self, path_and_query: &str) -> Result<Uri, http::uri::InvalidUri> {
        format!("{}{path_and_query}", self.base).parse()
    }

    /// The base as given (for messages).
    pub fn as_str(&self) -> &str {
        &self.base
    }
}

/// The pooled upstream client: HTTP/1, TCP_NODELAY, a connect timeout.
pub type UpstreamClient = Client<HttpConnector, Body>;

/// Builds the client.
pub fn client(connect_timeout: Duration) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    // Without it, small SSE chunks wait for delayed ACKs (Nagle's algorithm).
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .build(connector)
}

/// Copies `from` into `to` without the hop-by-hop headers.
pub fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            to.append(name.clone(), value.clone());
        }
    }
}

/// Why the upstream gave no response.
#[derive(Debug)]
pub enum UpstreamFailure {
    /// Connection refused, reset, DNS failure, a malformed response: 502.
    Unreachable(String),
    /// No connection or no response headers in time: 504.
    Timeout(String),
}

impl UpstreamFailure {
    /// Classifies a client error.
    pub fn from_client_error(base: &str, err: &hyper_util::client::legacy::Error) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        let mut detail = String::new();
        let mut timed_out = false;
        while let Some(e) = source {
            if !detail.is_empty() {
                detail.push_str(": ");
            }
            detail.push_str(&e.to_string());
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
                || e.to_string().contains("timed out")
                || e.to_string().contains("timeout")
            {
                timed_out = true;
            }
            source = e.source();
        }
        if timed_out {
            Self::Timeout(format!("upstream {base} timed out: {detail}"))
        } else {
            Self::Unreachable(format!("upstream {base} could not be reached: {detail}"))
        }
    }

    /// The HTTP status answered to the client.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unreachable(_) => StatusCode::BAD_GATEWAY,
            Self::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }
}

impl IntoResponse for UpstreamFailure {
    fn into_response(self) -> Response {
        let status = self.status();
        let (kind, message) = match self {
            Self::Unreachable(m) => ("bad_gateway", m),
            Self::Timeout(m) => ("gateway_timeout", m),
        };
        error_response(status, kind, message)
    }
}

/// `{"error":{"message","type","param","code"}}`, as the server answers.
pub fn error_response(status: StatusCode, kind: &str, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}});
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Sends `req` upstream, waiting at most `timeout` for the response headers.
pub async fn send(
    client: &UpstreamClient,
    base: &BaseUrl,
    req: http::Request<Body>,
    timeout: Duration,
) -> Result<http::Response<Incoming>, UpstreamFailure> {
    match tokio::time::timeout(timeout, client.request(req)).await {
        Err(_) => Err(UpstreamFailure::Timeout(format!(
            "upstream {} sent no response within {:.1} s",
            base.as_str(),
            timeout.as_secs_f64()
        ))),
        Ok(Err(e)) => Err(UpstreamFailure::from_client_error(base.as_str(), &e)),
        Ok(Ok(resp)) => Ok(resp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        let b = BaseUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            b.join("/v1/models?x=1").unwrap().to_string(),
            "http://127.0.0.1:8080/v1/models?x=1"
        );
        assert_eq!(
            BaseUrl::parse("http://h:1/v1/").unwrap().as_str(),
            "http://h:1"
        );
        assert_eq!(
            BaseUrl::parse("http://h:1/api/v1").unwrap().as_str(),
            "http://h:1/api"
        );
        for bad in [
            "https://h:1",
            "h:1",
            "http://",
            "ftp://h",
            "http://h:1/?q=1",
        ] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hop_by_hop_headers_stay() {
        let mut from = HeaderMap::new();
        from.insert("connection", HeaderValue::from_static("close"));
        from.insert("host", HeaderValue::from_static("a"));
        from.insert("x-request-id", HeaderValue::from_static("r1"));
        from.insert("authorization", HeaderValue::from_static("Bearer k"));
        let mut to = HeaderMap::new();
        copy_end_to_end(&from, &mut to);
        assert_eq!(to.len(), 2);
        assert_eq!(to["x-request-id"], "r1");
        assert_eq!(to["authorization"], "Bearer k");
    }
}
