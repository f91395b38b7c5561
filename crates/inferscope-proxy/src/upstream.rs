//! The upstream side: the base URL, the HTTP/1 connection pool (TCP_NODELAY),
//! header forwarding, and upstream failures as OpenAI error bodies (502, 504).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Uri};
use http_body::Frame;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use pin_project_lite::pin_project;
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
    /// `host:port`.
    authority: String,
    /// The path prefix without a trailing slash (often empty).
    prefix: String,
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
                    "https upstreams are not supported (TLS would put rustls and ring, \
                     C code included, into every build); run the proxy on the upstream's \
                     host and reach it over http",
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
            authority: authority.as_str().to_owned(),
            prefix: path.to_owned(),
        })
    }

    /// `host:port`, where requests go.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The upstream's path and query for a client's.
    pub fn path(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.prefix)
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

/// The upstream client: HTTP/1 connections (TCP_NODELAY) kept per host and
/// reused, LIFO.
///
/// Not hyper-util's pooled client: that one gets a connection back only
/// after its connection task has read the end of the previous response, and
/// its checkout races a new connect against the pool, so a client that sends
/// its next request the moment it has read the last one can land on a new
/// upstream connection. Here the response body hands the connection back the
/// moment it ends, and a checkout waits briefly for it to be ready: requests
/// one at a time keep one upstream connection (a test holds it to that).
#[derive(Clone)]
pub struct UpstreamClient {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    connect_timeout: Duration,
    /// Idle (or about to be idle) connections, by `host:port`.
    idle: Mutex<HashMap<String, Vec<SendRequest<Body>>>>,
}

/// How long a checkout waits for a pooled connection to finish its previous
/// exchange before it opens a new one.
const READY_WAIT: Duration = Duration::from_millis(50);
/// Idle connections kept per host (more are closed).
const MAX_IDLE_PER_HOST: usize = 64;

/// Builds the client.
pub fn client(connect_timeout: Duration) -> UpstreamClient {
    UpstreamClient {
        inner: Arc::new(ClientInner {
            connect_timeout,
            idle: Mutex::new(HashMap::new()),
        }),
    }
}

impl UpstreamClient {
    fn idle(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<SendRequest<Body>>>> {
        // A panic while holding it leaves only a map of connections behind.
        self.inner.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection to `authority` that is ready for a request: a pooled one
    /// (waiting briefly for one that is finishing), else a new one.
    async fn checkout(
        &self,
        authority: &str,
        fresh_only: bool,
    ) -> Result<SendRequest<Body>, ConnectError> {
        if !fresh_only {
            loop {
                let pooled = self.idle().get_mut(authority).and_then(Vec::pop);
                let Some(mut sender) = pooled else { break };
                if sender.is_closed() {
                    continue;
                }
                if sender.is_ready() {
                    return Ok(sender);
                }
                if let Ok(Ok(())) = tokio::time::timeout(READY_WAIT, sender.ready()).await {
                    return Ok(sender);
                }
            }
        }
        self.connect(authority).await
    }

    async fn connect(&self, authority: &str) -> Result<SendRequest<Body>, ConnectError> {
        let stream = crate::relay::connect(authority, self.inner.connect_timeout)
            .await
            .map_err(ConnectError::Tcp)?;
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ConnectError::Http)?;
        tokio::spawn(async move {
            // Its end (the upstream closed, or every sender and body dropped)
            // is seen by the senders as `is_closed`.
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn checkin(&self, authority: &str, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle();
        let list = idle.entry(authority.to_owned()).or_default();
        if list.len() < MAX_IDLE_PER_HOST {
            list.push(sender);
        }
    }

    /// Sends `req` (absolute URI) and returns the response, whose body gives
    /// the connection back when it ends. A pooled connection that turns out
    /// to be closed is replaced by a new one, once, before anything is sent.
    async fn request(
        &self,
        mut req: http::Request<Body>,
    ) -> Result<http::Response<PooledBody>, ConnectError> {
        let authority = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_owned())
            .ok_or(ConnectError::NoAuthority)?;
        // HTTP/1 wants the origin form and a Host header.
        let host = HeaderValue::from_str(&authority).map_err(|_| ConnectError::NoAuthority)?;
        req.headers_mut().insert(header::HOST, host);
        let origin: Uri = req
            .uri()
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .parse()
            .map_err(|_| ConnectError::NoAuthority)?;
        *req.uri_mut() = origin;
        let mut fresh_only = false;
        loop {
            let mut sender = self.checkout(&authority, fresh_only).await?;
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let (parts, incoming) = resp.into_parts();
                    let body = PooledBody {
                        inner: incoming,
                        lease: Some(Lease {
                            client: self.clone(),
                            authority,
                            sender,
                        }),
                    };
                    return Ok(http::Response::from_parts(parts, body));
                }
                Err(mut e) => match e.take_message() {
                    // Not sent: the pooled connection was closed under us.
                    Some(again) if !fresh_only => {
                        req = again;
                        fresh_only = true;
                    }
                    _ => return Err(ConnectError::Http(e.into_error())),
                },
            }
        }
    }
}

/// A checked-out connection, handed back when the response body ends.
struct Lease {
    client: UpstreamClient,
    authority: String,
    sender: SendRequest<Body>,
}

pin_project! {
    /// An upstream response body that returns its connection to the pool as
    /// soon as its last frame is read (dropped early, the connection closes).
    pub struct PooledBody {
        #[pin]
        inner: Incoming,
        lease: Option<Lease>,
    }
}

impl PooledBody {
    fn release(lease: &mut Option<Lease>) {
        if let Some(l) = lease.take() {
            l.client.checkin(&l.authority, l.sender);
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        if this.inner.is_end_stream() {
            Self::release(this.lease);
            return Poll::Ready(None);
        }
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        match &frame {
            None => Self::release(this.lease),
            Some(Ok(_)) if this.inner.is_end_stream() => Self::release(this.lease),
            _ => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Why no connection or no response came.
#[derive(Debug)]
enum ConnectError {
    NoAuthority,
    Tcp(crate::relay::RelayError),
    Http(hyper::Error),
}

/// A header that concerns one connection only (and `host`): not forwarded.
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(&name.as_str())
}

/// Copies `from` into `to` without the hop-by-hop headers.
pub fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        if !is_hop_by_hop(name) {
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
    fn from_connect_error(base: &str, err: &ConnectError) -> Self {
        match err {
            ConnectError::Tcp(e) => Self::from_relay_error(base, e),
            ConnectError::Http(e) => {
                let mut detail = e.to_string();
                let mut source = std::error::Error::source(e);
                while let Some(inner) = source {
                    detail.push_str(": ");
                    detail.push_str(&inner.to_string());
                    source = inner.source();
                }
                Self::Unreachable(format!("upstream {base} failed: {detail}"))
            }
            ConnectError::NoAuthority => {
                Self::Unreachable(format!("upstream {base}: the URL has no host"))
            }
        }
    }

    /// No response head within `timeout`.
    pub fn no_response(base: &BaseUrl, timeout: Duration) -> Self {
        Self::Timeout(format!(
            "upstream {} sent no response within {:.1} s",
            base.as_str(),
            timeout.as_secs_f64()
        ))
    }

    /// The failure a relayed request's error stands for (`base` for messages).
    pub fn from_relay_error(base: &str, err: &crate::relay::RelayError) -> Self {
        use crate::relay::RelayError;
        match err {
            RelayError::ConnectTimeout => {
                Self::Timeout(format!("upstream {base} timed out: no connection in time"))
            }
            RelayError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                Self::Timeout(format!("upstream {base} timed out: {e}"))
            }
            RelayError::Io(e) => {
                Self::Unreachable(format!("upstream {base} could not be reached: {e}"))
            }
            other => Self::Unreachable(format!("upstream {base} failed: {other}")),
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
) -> Result<http::Response<PooledBody>, UpstreamFailure> {
    match tokio::time::timeout(timeout, client.request(req)).await {
        Err(_) => Err(UpstreamFailure::no_response(base, timeout)),
        Ok(Err(e)) => Err(UpstreamFailure::from_connect_error(base.as_str(), &e)),
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
