//! The doctor's own small HTTP client: `GET` a URL (`/metrics`, the
//! Prometheus API) and return the body. Plain http only, like the server.

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Why a `GET` failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL is not a plain `http://` URL.
    #[error("invalid argument: {0}")]
    InvalidUrl(String),
    /// Connecting, sending or reading failed, or the status was not 200.
    #[error("server: {0}")]
    Server(String),
}

/// Error text with its chain of causes (hyper's top-level messages are terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn parse_http_uri(url: &str) -> Result<Uri, FetchError> {
    let uri: Uri = url
        .parse()
        .map_err(|e| FetchError::InvalidUrl(format!("bad URL {url:?}: {e}")))?;
    match uri.scheme_str() {
        Some("http") => Ok(uri),
        Some("https") => Err(FetchError::InvalidUrl(format!(
            "{url}: https is not supported; read the server over plain http"
        ))),
        _ => Err(FetchError::InvalidUrl(format!(
            "{url}: expected an http:// URL"
        ))),
    }
}

/// `GET url` and the body as text; errors on non-200 or after `timeout`.
pub async fn get_text(url: &str, timeout: Duration) -> Result<String, FetchError> {
    let uri = parse_http_uri(url)?;
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(timeout));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(conn);
    let req = Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| FetchError::InvalidUrl(format!("{url}: {e}")))?;
    let fut = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| FetchError::Server(format!("{url}: {}", error_chain(&e))))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| FetchError::Server(format!("{url}: {}", error_chain(&e))))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(FetchError::Server(format!("{url}: HTTP {status}")));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| FetchError::Server(format!("{url}: timed out")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http() {
        assert!(parse_http_uri("https://x/metrics").is_err());
        assert!(parse_http_uri("ftp://x/metrics").is_err());
        assert!(parse_http_uri("http://127.0.0.1:8000/metrics").is_ok());
    }
}
