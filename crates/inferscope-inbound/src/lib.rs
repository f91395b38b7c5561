//! Client connections of `serve` and `proxy`: plain HTTP/1.1 requests are
//! read and answered here, straight on the socket, and anything else (a
//! chunked or `Expect` body, an upgrade, HTTP/1.0, `HEAD`, a malformed head)
//! hands the connection to hyper's server (with the bytes already read) for
//! the rest of its life. Both paths call the same [`Connection`] service.
//!
//! Why: hyper's server reads a request through a per-request body channel,
//! dispatch state and boxed bodies, and writes the response through its own
//! buffers; here a request with a `Content-Length` is read into one buffer
//! and its response leaves in one write. For the proxy that is time before
//! the upstream sees the request (docs/proxy.md, "How the proxy keeps out of
//! the first token's way"); for the server, a share of every request's CPU
//! (docs/results/request-path.md).

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::response::Response;
use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, Version, header};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use inferscope_metrics::http::generation_route;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::Service;

/// What serves a connection's requests: those read here (a [`ReadBody`],
/// which knows when the request's head was read), and after a hand-off
/// hyper's. Nothing is put in a read request's extensions (each insert is
/// an allocation on the request path): the service finds the route from
/// the method and path (`generation_route`), and inserts what its layers
/// need (`RequestStart`, `RouteTemplate`) or hands it to them directly.
/// One value per connection (it may know the peer); the fast path calls it
/// without `poll_ready`'s wait, so it must be ready at once, as routers and
/// handlers are.
pub trait Connection:
    Service<Request<Incoming>, Response = Response, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
    /// The largest body read here; a larger one is hyper's to refuse (the
    /// router's body limit answers 413 as for any request).
    fn max_body(&self) -> usize;

    /// Serves a request read here. Not a `Service`'s `call`: its future is
    /// held in the connection's own (one allocation per connection), so it
    /// need not be boxed per request to have a type a `Service` can name.
    fn serve_read(&mut self, req: Request<ReadBody>) -> impl Future<Output = Response> + Send;
}

/// Accepts connections (TCP_NODELAY) and serves each with the service
/// `connection` makes for its peer, until `stop`; then lets the open ones
/// finish their requests and returns when all have ended (the caller bounds
/// how long).
pub async fn serve<S: Connection>(
    listener: TcpListener,
    mut connection: impl FnMut(SocketAddr) -> S,
    stop: watch::Receiver<bool>,
) {
    // Each connection holds a sender: when all are dropped, all have ended.
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let mut stopped = stop.clone();
    let stopping = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    tokio::pin!(stopping);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Out of descriptors or a connection reset before accept:
                // the listener itself is fine; pause so a storm does not spin.
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
            () = &mut stopping => break,
        };
        // Without TCP_NODELAY, SSE chunks meet Nagle's algorithm and delayed ACKs.
        let _ = stream.set_nodelay(true);
        let conn = serve_connection(stream, connection(peer), stop.clone());
        let open = open.clone();
        tokio::spawn(async move {
            conn.await;
            drop(open);
        });
    }
    drop(listener);
    drop(open);
    let _ = all_closed.recv().await;
}

/// The most header lines a fast-path head may have (more: hyper's turn).
const MAX_HEADERS: usize = 64;
/// A head not complete within this many bytes goes to hyper (which answers 431).
const MAX_HEAD: usize = 64 * 1024;
/// How much a client may send ahead (pipelined) while a response streams;
/// past it the connection stops reading until the response is done.
const MAX_AHEAD: usize = 64 * 1024;

/// What to do with a parsed head.
// Matched at once where it is made: a box would only add an allocation to
// every request's path.
#[allow(clippy::large_enum_variant)]
enum Head {
    /// A request the fast path serves: its head (which has left the
    /// buffer; the body is to come) and the body's length.
    Fast {
        request: http::Request<()>,
        content_length: usize,
    },
    /// Anything else: hyper's turn.
    Other,
    /// Not complete yet.
    Partial,
}

/// Parses the head at the start of `buf` and says whether the fast path
/// takes it: HTTP/1.1, a method with a response body (not `HEAD` or
/// `CONNECT`), an origin-form target, at most one `Content-Length` within
/// `max_body`, no `Transfer-Encoding`, `Expect` or `Upgrade`, and
/// `Connection` absent or `keep-alive`, whatever the path: clients such as
/// the bench's ask `/tokenize` or `/v1/models` first on the connection they
/// then post on. A head the fast path takes leaves `buf`: its header values
/// are slices of it, not copies. `fields` is scratch space, kept by the
/// connection so that no request allocates it.
fn parse_head(
    buf: &mut BytesMut,
    max_body: usize,
    fields: &mut Vec<(HeaderName, Range<usize>)>,
) -> Head {
    fields.clear();
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => return Head::Partial,
        // Malformed, too many headers or too long: hyper answers as before.
        _ => return Head::Other,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return Head::Other;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Head::Other;
    };
    if method == Method::HEAD || method == Method::CONNECT || !target.starts_with('/') {
        return Head::Other;
    }
    // The generation routes' URIs are parsed once, then cloned (cheaply:
    // static bytes).
    static GENERATION_URIS: LazyLock<[Uri; 2]> = LazyLock::new(|| {
        [
            Uri::from_static("/v1/completions"),
            Uri::from_static("/v1/chat/completions"),
        ]
    });
    let uri = match generation_route(&method, target) {
        Some(route) => GENERATION_URIS
            .iter()
            .find(|u| u.path() == route)
            .cloned()
            .unwrap_or_else(|| Uri::from_static(route)),
        None => match Uri::try_from(target) {
            Ok(uri) => uri,
            Err(_) => return Head::Other,
        },
    };
    let mut content_length = None;
    for h in req.headers.iter() {
        // A value `HeaderValue` takes (checked here: it is made below, from
        // the head's own bytes, once the head has left the buffer).
        let valid = h
            .value
            .iter()
            .all(|&b| b == b'\t' || (b >= b' ' && b != 0x7f));
        let (Ok(name), true) = (HeaderName::from_bytes(h.name.as_bytes()), valid) else {
            return Head::Other;
        };
        if name == header::CONTENT_LENGTH {
            let n = std::str::from_utf8(h.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<usize>().ok());
            match (content_length, n) {
                (None, Some(n)) if n <= max_body => content_length = Some(n),
                _ => return Head::Other,
            }
        } else if name == header::TRANSFER_ENCODING
            || name == header::EXPECT
            || name == header::UPGRADE
            || (name == header::CONNECTION && !h.value.eq_ignore_ascii_case(b"keep-alive"))
        {
            return Head::Other;
        }
        let start = h.value.as_ptr() as usize - buf.as_ptr() as usize;
        fields.push((name, start..start + h.value.len()));
    }
    let head = buf.split_to(head_len).freeze();
    let mut headers = HeaderMap::with_capacity(fields.len());
    for (name, range) in fields.drain(..) {
        // Checked above, so never skipped.
        if let Ok(value) = HeaderValue::from_maybe_shared(head.slice(range)) {
            headers.append(name, value);
        }
    }
    let mut request = http::Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Head::Fast {
        request,
        // Neither length nor chunked: HTTP/1.1 says the body is empty.
        content_length: content_length.unwrap_or(0),
    }
}

/// A request body read whole before the service is called; truncated when
/// the client closed before sending all of it (the handler then sees a read
/// error, as it would from hyper).
pub struct ReadBody {
    data: Option<Bytes>,
    truncated: bool,
    read_at: Instant,
}

impl ReadBody {
    /// When the request's head was read: where its HTTP duration starts.
    pub fn read_at(&self) -> Instant {
        self.read_at
    }

    /// The body's bytes, until they are polled.
    pub fn bytes(&self) -> Option<&Bytes> {
        self.data.as_ref()
    }

    /// Whether the client closed before the whole body came.
    pub fn is_truncated(&self) -> bool {
        self.truncated
    }
}

impl http_body::Body for ReadBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut self.truncated) {
            return Poll::Ready(Some(Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the client closed before the whole body (Content-Length)",
            ))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.truncated
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Serves one client connection: plain requests here, and from the first
/// request that is anything else, hyper until the end.
pub async fn serve_connection<S: Connection>(
    mut stream: TcpStream,
    mut service: S,
    mut stop: watch::Receiver<bool>,
) {
    let max_body = service.max_body();
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut fields = Vec::with_capacity(16);
    loop {
        // Read until a head is complete (idle keep-alive ends on stop).
        let (request, content_length) = loop {
            if !buf.is_empty() {
                match parse_head(&mut buf, max_body, &mut fields) {
                    Head::Fast {
                        request,
                        content_length,
                    } => break (request, content_length),
                    Head::Other => return hand_to_hyper(stream, buf.freeze(), service, stop).await,
                    Head::Partial => {}
                }
            }
            tokio::select! {
                biased;
                read = stream.read_buf(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                },
                _ = stop.wait_for(|s| *s), if buf.is_empty() => return,
            }
        };
        let read_at = Instant::now();
        // The body: as much as `Content-Length` says; what follows is the
        // next request's.
        let mut truncated = false;
        if buf.len() < content_length {
            buf.reserve(content_length - buf.len());
            while buf.len() < content_length {
                match stream.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => {
                        truncated = true;
                        break;
                    }
                    Ok(_) => {}
                }
            }
        }
        let body = buf.split_to(content_length.min(buf.len())).freeze();
        let request = request.map(|()| ReadBody {
            data: Some(body),
            truncated,
            read_at,
        });
        // The handler refuses a short body (400, recorded by the metrics
        // layer as under hyper); a half-closed client can still read the
        // answer. The connection ends after it.
        let keep = !truncated;
        let response = {
            let served = service.serve_read(request);
            tokio::pin!(served);
            // A client that goes away before the response head drops the
            // handler (for the proxy, the upstream request with it: an abort).
            loop {
                tokio::select! {
                    biased;
                    r = &mut served => break r,
                    read = stream.read_buf(&mut buf), if keep && buf.len() < MAX_AHEAD => match read {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    },
                }
            }
        };
        if !respond(&mut stream, &mut buf, &mut out, response).await || !keep {
            return;
        }
    }
}

/// Writes `response` to the client, head and body (chunked unless its
/// length is known); false when the connection cannot carry another request
/// (the client went away, a write failed, the body failed or came out
/// short).
async fn respond<B>(
    stream: &mut TcpStream,
    ahead: &mut BytesMut,
    out: &mut Vec<u8>,
    response: http::Response<B>,
) -> bool
where
    B: http_body::Body<Data = Bytes>,
{
    let (parts, body) = response.into_parts();
    let mut body = std::pin::pin!(body);
    let bodiless = parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let length = declared.or_else(|| body.size_hint().exact());
    out.clear();
    write_head(
        out,
        &parts,
        declared.is_none().then_some(length).flatten(),
        bodiless,
    );
    let chunked = length.is_none() && !bodiless;
    let mut sent: u64 = 0;
    let mut ended = bodiless || body.is_end_stream();
    // Frames ready now leave with the head, and with each other: one write
    // per wake-up, as hyper's buffered writes did.
    loop {
        while !ended {
            let polled = std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll_frame(cx))).await;
            match polled {
                Poll::Pending => break,
                Poll::Ready(None) => ended = true,
                Poll::Ready(Some(Err(_))) => {
                    // Cut: the client sees the stream end without its terminator.
                    let _ = stream.write_all(out).await;
                    return false;
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        put_data(out, &data, chunked);
                        sent += data.len() as u64;
                    }
                    ended = body.is_end_stream();
                }
            }
        }
        if ended && chunked {
            out.extend_from_slice(b"0\r\n\r\n");
        }
        if !out.is_empty() {
            if stream.write_all(out).await.is_err() {
                return false;
            }
            out.clear();
        }
        if ended {
            return length.is_none_or(|n| n == sent || bodiless);
        }
        // Wait for the next frame; a client that closes meanwhile drops
        // the body (the request ends, counted as an abort).
        let waited = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx));
        tokio::select! {
            biased;
            frame = waited => match frame {
                None => ended = true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        put_data(out, &data, chunked);
                        sent += data.len() as u64;
                    }
                    ended = body.is_end_stream();
                }
            },
            read = stream.read_buf(ahead), if ahead.len() < MAX_AHEAD => match read {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            },
        }
    }
}

/// Appends one body frame, in a chunk when `chunked`.
fn put_data(out: &mut Vec<u8>, data: &[u8], chunked: bool) {
    if data.is_empty() {
        return;
    }
    if chunked {
        // Into the reused buffer: no allocation per chunk.
        let _ = write!(out, "{:x}\r\n", data.len());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    } else {
        out.extend_from_slice(data);
    }
}

/// The status line and headers, with `date` as hyper adds it, and the
/// framing: `content-length` when the length is known but not in the
/// headers (`add_length`), else chunked.
fn write_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    add_length: Option<u64>,
    bodiless: bool,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !parts.headers.contains_key(header::DATE) {
        out.extend_from_slice(b"date: ");
        put_date(out);
        out.extend_from_slice(b"\r\n");
    }
    if !bodiless && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        match add_length {
            Some(n) => {
                let _ = write!(out, "content-length: {n}\r\n");
            }
            None => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// An IMF-fixdate's length ("Sun, 06 Nov 1994 08:49:37 GMT").
const DATE_LEN: usize = 29;

thread_local! {
    /// The `date` value of this thread's current second: (Unix second, text).
    static DATE: std::cell::Cell<(u64, [u8; DATE_LEN])> =
        const { std::cell::Cell::new((u64::MAX, [0; DATE_LEN])) };
}

/// Appends the `date` header's value: formatted once a second per thread,
/// as hyper does (formatting it is a few hundred instructions and an
/// allocation).
fn put_date(out: &mut Vec<u8>) {
    let now = std::time::SystemTime::now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (cached, mut text) = DATE.get();
    if cached != second {
        let formatted = httpdate::fmt_http_date(now);
        if formatted.len() != DATE_LEN {
            // Not a four-digit year: not cached.
            out.extend_from_slice(formatted.as_bytes());
            return;
        }
        text.copy_from_slice(formatted.as_bytes());
        DATE.set((second, text));
    }
    out.extend_from_slice(&text);
}

/// Serves the rest of the connection with hyper, `read` first.
async fn hand_to_hyper<S: Connection>(
    stream: TcpStream,
    read: Bytes,
    service: S,
    mut stop: watch::Receiver<bool>,
) {
    let io = hyper_util::rt::TokioIo::new(Rewind { read, io: stream });
    let service = hyper_util::service::TowerToHyperService::new(service);
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => return log_end(r),
        _ = stop.wait_for(|s| *s) => {}
    }
    conn.as_mut().graceful_shutdown();
    log_end(conn.await);
}

fn log_end(r: Result<(), hyper::Error>) {
    if let Err(e) = r {
        tracing::debug!(error = %e, "client connection ended with an error");
    }
}

/// A socket whose reads give `read` (bytes the fast path took already) first.
struct Rewind {
    read: Bytes,
    io: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.read.is_empty() {
            let n = self.read.len().min(buf.remaining());
            buf.put_slice(&self.read[..n]);
            self.read.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fast` (a generation post, exactly), `plain` (read here, any other
    /// request), `other` (hyper's) or `partial`.
    fn kind(head: &str) -> &'static str {
        match parse_head(&mut BytesMut::from(head), 1000, &mut Vec::new()) {
            Head::Fast { request, .. }
                if generation_route(
                    request.method(),
                    request.uri().path_and_query().map_or("", |p| p.as_str()),
                )
                .is_some() =>
            {
                "fast"
            }
            Head::Fast { .. } => "plain",
            Head::Other => "other",
            Head::Partial => "partial",
        }
    }

    #[test]
    fn plain_http11_requests_take_the_fast_path() {
        let fast = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(kind(fast), "fast");
        let mut buf = BytesMut::from(fast);
        match parse_head(&mut buf, 1000, &mut Vec::new()) {
            Head::Fast {
                request,
                content_length,
            } => {
                assert_eq!(
                    &buf[..],
                    b"{}",
                    "the head left the buffer, the body did not"
                );
                assert_eq!(content_length, 2);
                assert_eq!(request.uri().path(), "/v1/completions");
                assert_eq!(request.headers()["host"], "x");
                assert!(request.extensions().is_empty(), "nothing inserted");
            }
            _ => unreachable!(),
        }
        assert_eq!(
            kind(
                "POST /v1/chat/completions HTTP/1.1\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n"
            ),
            "fast"
        );
        // Neither length nor chunked: an empty body (the handler refuses it).
        assert_eq!(kind("POST /v1/completions HTTP/1.1\r\n\r\n"), "fast");
        assert_eq!(
            kind("POST /v1/completions HTTP/1.1\r\nhost: x\r\n"),
            "partial"
        );
        assert_eq!(kind("POST /v1/compl"), "partial");
        // Plain requests to other routes (or not exactly a generation path)
        // are read here too and go to the router, as under hyper.
        for plain in [
            "GET /v1/completions HTTP/1.1\r\n\r\n",
            "GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n",
            "POST /tokenize HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/models HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions?x=1 HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions/ HTTP/1.1\r\ncontent-length: 2\r\n\r\n",
        ] {
            assert_eq!(kind(plain), "plain", "{plain:?}");
        }
        for other in [
            "HEAD /v1/models HTTP/1.1\r\n\r\n",
            "CONNECT x:443 HTTP/1.1\r\n\r\n",
            "GET http://x/v1/models HTTP/1.1\r\n\r\n",
            "POST /v1/completions HTTP/1.0\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: +2\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 1001\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\nupgrade: h2c\r\n\r\n",
            "POST /v1/completions HTTP/1.1\r\nbad header\r\n\r\n",
        ] {
            assert_eq!(kind(other), "other", "{other:?}");
        }
        let long = format!(
            "POST /v1/completions HTTP/1.1\r\nx: {}",
            "a".repeat(MAX_HEAD)
        );
        assert_eq!(kind(&long), "other", "a head that never ends");
    }

    #[test]
    fn the_head_says_how_the_body_is_framed() {
        let parts = |status: u16, headers: &[(&str, &str)]| {
            let mut r = http::Response::builder().status(status);
            for (k, v) in headers {
                r = r.header(*k, *v);
            }
            r.body(()).unwrap().into_parts().0
        };
        let head = |p: &http::response::Parts, len: Option<u64>, bodiless: bool| {
            let mut out = Vec::new();
            write_head(&mut out, p, len, bodiless);
            String::from_utf8(out).unwrap()
        };
        let sse = head(
            &parts(200, &[("content-type", "text/event-stream")]),
            None,
            false,
        );
        assert!(
            sse.starts_with("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ndate: "),
            "{sse}"
        );
        assert!(
            sse.ends_with("\r\ntransfer-encoding: chunked\r\n\r\n"),
            "{sse}"
        );
        let sized = head(&parts(401, &[]), Some(42), false);
        assert!(
            sized.starts_with("HTTP/1.1 401 Unauthorized\r\n"),
            "{sized}"
        );
        assert!(sized.ends_with("\r\ncontent-length: 42\r\n\r\n"), "{sized}");
        let given = head(&parts(200, &[("content-length", "7")]), None, false);
        assert_eq!(given.matches("content-length").count(), 1, "{given}");
        assert!(!given.contains("chunked"), "{given}");
        let none = head(&parts(204, &[]), None, true);
        assert!(
            !none.contains("chunked") && !none.contains("content-length"),
            "{none}"
        );

        let mut out = Vec::new();
        put_data(&mut out, b"data: x\n\n", true);
        put_data(&mut out, b"", true);
        assert_eq!(out, b"9\r\ndata: x\n\n\r\n");
    }

    #[test]
    fn the_date_is_formatted_once_a_second() {
        const EPOCH: &[u8; DATE_LEN] = b"Thu, 01 Jan 1970 00:00:00 GMT";
        let date = || {
            let mut out = Vec::new();
            put_date(&mut out);
            String::from_utf8(out).unwrap()
        };
        // A value cached for another second is not used...
        DATE.set((0, *EPOCH));
        let before = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
        let fresh = httpdate::parse_http_date(&date()).expect("an HTTP date");
        assert!(fresh >= before && fresh <= std::time::SystemTime::now());
        // ...one cached for this second is.
        let (second, _) = DATE.get();
        DATE.set((second, *EPOCH));
        let again = date();
        assert!(
            again.as_bytes() == EPOCH || DATE.get().0 != second,
            "{again}: the cached text, unless the second turned"
        );
    }
}
