//! A small HTTP/1.1 client for the measured routes: the upstream connection
//! is read by the response body itself, in the task that writes to the
//! client.
//!
//! Why not hyper's client here: its connection is a separate task that hands
//! each chunk to the response body through a channel, so every chunk costs a
//! task wake-up and a second poll between the upstream socket and the client
//! socket, on the path of the first token. Here a chunk is read, decoded and
//! passed on in one poll of the client's connection. The request (head and
//! body) leaves in one write, which the fast inbound path makes before the
//! handler runs ([`RelayPool::send_on_idle`], then [`Sent::response`]).
//! hyper's client still carries the upstream requests that stream a body.
//!
//! What it speaks: requests with a known body; responses framed by
//! `Transfer-Encoding: chunked`, `Content-Length`, or the connection's end;
//! keep-alive (a connection goes back to the pool the moment its response
//! ends, read to the last byte); 1xx answers skipped.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use http_body::Frame;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// Response headers the relay reads at most.
const MAX_HEADERS: usize = 128;
/// The largest response head (status line and headers) accepted.
const MAX_HEAD: usize = 64 * 1024;
/// The longest chunk-size line (with extensions) or trailer section accepted.
const MAX_LINE: usize = 4 * 1024;
/// Idle connections kept (more are closed).
const MAX_IDLE: usize = 64;
/// Read buffer size.
const READ_CHUNK: usize = 16 * 1024;

/// Why a relayed exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// No connection in time.
    #[error("no connection in time")]
    ConnectTimeout,
    /// A socket error (refused, reset).
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The upstream closed the connection before the response ended.
    #[error("the upstream closed the connection {0}")]
    Closed(&'static str),
    /// The response is not valid HTTP/1.1.
    #[error("malformed response from the upstream: {0}")]
    Malformed(String),
}

/// Idle upstream connections, by `host:port`, and how to open new ones.
///
/// Each serving thread has its own (a socket is registered with the runtime
/// that opened it).
#[derive(Clone)]
pub struct RelayPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    connect_timeout: Duration,
    idle: Mutex<Vec<(String, TcpStream)>>,
}

impl RelayPool {
    /// An empty pool.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(PoolInner {
                connect_timeout,
                idle: Mutex::new(Vec::new()),
            }),
        }
    }

    /// How long a new connection may take (`--connect-timeout`).
    pub fn connect_timeout(&self) -> Duration {
        self.inner.connect_timeout
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(String, TcpStream)>> {
        // A panic while holding it leaves only a list of sockets behind.
        self.inner.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used idle connection to `authority` that is still
    /// open, if any.
    fn take_idle(&self, authority: &str) -> Option<TcpStream> {
        loop {
            let stream = {
                let mut idle = self.idle();
                let at = idle.iter().rposition(|(a, _)| a == authority)?;
                idle.remove(at).1
            };
            // An idle connection has nothing to read: a byte or the end means
            // the upstream closed it (or broke the protocol). Without a
            // readiness event this costs no syscall.
            let mut probe = [0u8; 1];
            match stream.try_read(&mut probe) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Some(stream),
                _ => continue,
            }
        }
    }

    fn put_idle(&self, authority: String, stream: TcpStream) {
        let mut idle = self.idle();
        if idle.len() >= MAX_IDLE {
            idle.remove(0);
        }
        idle.push((authority, stream));
    }

    async fn connect(&self, authority: &str) -> Result<TcpStream, RelayError> {
        connect(authority, self.inner.connect_timeout).await
    }

    /// Sends one request and reads the response head; the body reads the
    /// rest. `headers` go as given (end-to-end ones; the caller leaves out
    /// hop-by-hop headers and `content-length`). A pooled connection that
    /// the upstream had closed (nothing at all came back) is replaced by a
    /// new one, once.
    pub async fn send<'h>(
        &self,
        method: &Method,
        authority: &str,
        path_and_query: &str,
        headers: impl IntoIterator<Item = (&'h HeaderName, &'h HeaderValue)>,
        body: Bytes,
    ) -> Result<http::Response<RelayBody>, RelayError> {
        let head = request_head(method, authority, path_and_query, headers, body.len());
        let sent = match self.send_on_idle(method, authority, head, body) {
            Ok(sent) => sent,
            Err((head, body)) => {
                let stream = self.connect(authority).await?;
                self.sent(stream, false, method, authority, head, body)
            }
        };
        sent.response().await
    }

    /// Starts a request without waiting: on an idle pooled connection, as
    /// much of it as the socket takes now (all of it, for a request of a
    /// few kilobytes). Gives the request back when no connection is idle.
    ///
    /// Why: the fast inbound path sends a generation request upstream the
    /// moment it has read it, and does its bookkeeping (the HTTP metrics,
    /// the observer) while the upstream works, not before.
    pub fn send_on_idle(
        &self,
        method: &Method,
        authority: &str,
        head: Vec<u8>,
        body: Bytes,
    ) -> Result<Sent, (Vec<u8>, Bytes)> {
        let Some(stream) = self.take_idle(authority) else {
            return Err((head, body));
        };
        let mut sent = self.sent(stream, true, method, authority, head, body);
        sent.written = sent
            .stream
            .try_write_vectored(&[IoSlice::new(&sent.head), IoSlice::new(&sent.body)])
            .unwrap_or(0);
        Ok(sent)
    }

    /// A request about to leave on `stream` (`reused`: from the pool).
    fn sent(
        &self,
        stream: TcpStream,
        reused: bool,
        method: &Method,
        authority: &str,
        head: Vec<u8>,
        body: Bytes,
    ) -> Sent {
        Sent {
            stream,
            reused,
            head,
            body,
            written: 0,
            head_request: method == Method::HEAD,
            authority: authority.to_owned(),
            pool: self.clone(),
        }
    }
}

/// A request on its way upstream: its connection, and the bytes (kept to be
/// sent again on a new connection if the pooled one turns out closed).
pub struct Sent {
    stream: TcpStream,
    /// The connection came from the pool (may have been closed meanwhile).
    reused: bool,
    head: Vec<u8>,
    body: Bytes,
    /// How much of head and body has left.
    written: usize,
    head_request: bool,
    authority: String,
    pool: RelayPool,
}

impl Sent {
    /// Sends the rest of the request and reads the response head; the body
    /// reads the rest. A pooled connection that the upstream had closed
    /// (nothing at all came back) is replaced by a new one, once.
    pub async fn response(self) -> Result<http::Response<RelayBody>, RelayError> {
        let Sent {
            mut stream,
            mut reused,
            head,
            body,
            mut written,
            head_request,
            authority,
            pool,
        } = self;
        loop {
            let sent = if written < head.len() {
                write_all2(&mut stream, &head[written..], &body).await
            } else {
                stream.write_all(&body[written - head.len()..]).await
            };
            let mut buf = BytesMut::with_capacity(READ_CHUNK);
            let got = match sent {
                Ok(()) => read_head(&mut stream, &mut buf, head_request).await,
                Err(e) => Err(RelayError::Io(e)),
            };
            match got {
                Ok((parts, framing, keep_alive)) => {
                    let mut body = RelayBody {
                        stream: Some(stream),
                        buf,
                        framing,
                        keep_alive,
                        pool,
                        authority,
                    };
                    body.settle();
                    return Ok(http::Response::from_parts(parts, body));
                }
                // A kept-alive connection the upstream closed as we sent:
                // nothing came back, so nothing ran; once more on a new one.
                Err(e) if reused && buf.is_empty() && closed_early(&e) => {
                    stream = pool.connect(&authority).await?;
                    reused = false;
                    written = 0;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A TCP connection to `authority` within `timeout`, with Nagle's algorithm
/// off (small SSE chunks would otherwise wait for delayed ACKs); both
/// upstream clients open theirs here.
pub async fn connect(authority: &str, timeout: Duration) -> Result<TcpStream, RelayError> {
    let stream = tokio::time::timeout(timeout, TcpStream::connect(authority))
        .await
        .map_err(|_| RelayError::ConnectTimeout)??;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn closed_early(e: &RelayError) -> bool {
    match e {
        RelayError::Closed(_) => true,
        RelayError::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionAborted
        ),
        _ => false,
    }
}

/// The request line and headers, with `host` and `content-length`.
pub fn request_head<'h>(
    method: &Method,
    authority: &str,
    path_and_query: &str,
    headers: impl IntoIterator<Item = (&'h HeaderName, &'h HeaderValue)>,
    body_len: usize,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(512);
    head.extend_from_slice(method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(path_and_query.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    head.extend_from_slice(authority.as_bytes());
    head.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if *name == header::HOST || *name == header::CONTENT_LENGTH {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    // A body-less GET says nothing of a body, as clients do.
    if body_len > 0 || !matches!(*method, Method::GET | Method::HEAD) {
        head.extend_from_slice(b"content-length: ");
        head.extend_from_slice(body_len.to_string().as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// Writes `a` then `b`, in one `writev` when the socket takes it all.
async fn write_all2(stream: &mut TcpStream, a: &[u8], b: &[u8]) -> std::io::Result<()> {
    let (mut a, mut b) = (a, b);
    while !a.is_empty() {
        let n = stream
            .write_vectored(&[IoSlice::new(a), IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n < a.len() {
            a = &a[n..];
        } else {
            b = &b[n - a.len()..];
            a = &[];
        }
    }
    stream.write_all(b).await
}

/// Reads into `buf`'s spare room; 0 means the upstream closed.
fn poll_read_some(
    stream: &mut TcpStream,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(READ_CHUNK);
    }
    let spare = buf.spare_capacity_mut();
    let mut rb = ReadBuf::uninit(spare);
    ready!(Pin::new(stream).poll_read(cx, &mut rb))?;
    let n = rb.filled().len();
    // SAFETY: `poll_read` initialised the first `n` bytes of the spare room.
    unsafe { buf.set_len(buf.len() + n) };
    Poll::Ready(Ok(n))
}

async fn read_some(stream: &mut TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    std::future::poll_fn(|cx| poll_read_some(stream, cx, buf)).await
}

/// Reads the response head (skipping 1xx answers); leaves what follows it
/// in `buf`. Returns the client-facing parts, the body's framing, and
/// whether the connection may be reused.
async fn read_head(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<(http::response::Parts, Framing, bool), RelayError> {
    loop {
        let parsed = parse_head(buf, head_request)?;
        if let Some((len, parts, framing, keep_alive)) = parsed {
            buf.advance(len);
            if parts.status.is_informational() {
                continue;
            }
            return Ok((parts, framing, keep_alive));
        }
        if buf.len() > MAX_HEAD {
            return Err(RelayError::Malformed(format!(
                "response head over {MAX_HEAD} bytes"
            )));
        }
        if read_some(stream, buf).await? == 0 {
            return Err(RelayError::Closed("before the response head"));
        }
    }
}

type ParsedHead = (usize, http::response::Parts, Framing, bool);

/// Parses a complete response head at the start of `buf` (`None`: not all
/// of it is there yet).
fn parse_head(buf: &[u8], head_request: bool) -> Result<Option<ParsedHead>, RelayError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(RelayError::Malformed(e.to_string())),
    };
    let code = resp.code.unwrap_or(0);
    let status =
        StatusCode::from_u16(code).map_err(|_| RelayError::Malformed(format!("status {code}")))?;
    let mut builder = http::Response::builder().status(status);
    let mut chunked = false;
    let mut other_coding = false;
    let mut length: Option<u64> = None;
    let mut close = resp.version != Some(1);
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| RelayError::Malformed(format!("header name {:?}", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| RelayError::Malformed(format!("value of header {:?}", h.name)))?;
        if name == header::TRANSFER_ENCODING {
            let text = value.to_str().unwrap_or("");
            // Chunked must be the last coding; anything else ends with the connection.
            let last = text.rsplit(',').next().unwrap_or("").trim();
            chunked = last.eq_ignore_ascii_case("chunked");
            other_coding = !chunked;
        } else if name == header::CONTENT_LENGTH {
            let n: u64 = value
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| RelayError::Malformed("content-length".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(RelayError::Malformed("two content-lengths".into()));
            }
            length = Some(n);
        } else if name == header::CONNECTION {
            let text = value.to_str().unwrap_or("");
            if text
                .split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("close"))
            {
                close = true;
            }
        }
        builder = builder.header(name, value);
    }
    let framing = if head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Framing::Length(0)
    } else if chunked {
        Framing::Chunked(Chunked::Size)
    } else if other_coding {
        Framing::UntilClose
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    let keep_alive = !close && !matches!(framing, Framing::UntilClose);
    let resp = builder
        .body(())
        .map_err(|e| RelayError::Malformed(e.to_string()))?;
    Ok(Some((len, resp.into_parts().0, framing, keep_alive)))
}

/// How the response body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes left.
    Length(u64),
    /// `Transfer-Encoding: chunked`, in this state.
    Chunked(Chunked),
    /// When the upstream closes the connection.
    UntilClose,
    /// Read to its end.
    Done,
}

/// Where a chunked decoder stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunked {
    /// Before a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers,
}

/// What one decoding step gave.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Body bytes.
    Data(Bytes),
    /// More input is needed.
    More,
    /// The body ended.
    End,
}

/// The index just past the first CRLF (or bare LF) in `buf`.
fn line_end(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n').map(|i| i + 1)
}

impl Framing {
    /// Decodes from the front of `buf`: body bytes (as many as are there,
    /// up to the end of the current chunk), a need for more, or the end.
    fn step(&mut self, buf: &mut BytesMut) -> Result<Step, RelayError> {
        loop {
            match self {
                Framing::Done => return Ok(Step::End),
                Framing::Length(0) => {
                    *self = Framing::Done;
                    return Ok(Step::End);
                }
                Framing::Length(left) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let n = (*left).min(buf.len() as u64) as usize;
                    *left -= n as u64;
                    return Ok(Step::Data(buf.split_to(n).freeze()));
                }
                Framing::UntilClose => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    return Ok(Step::Data(buf.split().freeze()));
                }
                Framing::Chunked(Chunked::Data(left)) => {
                    if buf.is_empty() {
                        return Ok(Step::More);
                    }
                    let n = (*left).min(buf.len() as u64) as usize;
                    let rest = *left - n as u64;
                    *self = Framing::Chunked(if rest == 0 {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(rest)
                    });
                    return Ok(Step::Data(buf.split_to(n).freeze()));
                }
                Framing::Chunked(_) => {
                    if !self.frame_line(buf)? {
                        return Ok(Step::More);
                    }
                }
            }
        }
    }

    /// Reads one framing line of a chunked body (a size line, the CRLF
    /// after a chunk's data, a trailer line) when all of it is in `buf`;
    /// `false` when it is not there yet.
    fn frame_line(&mut self, buf: &mut BytesMut) -> Result<bool, RelayError> {
        let Framing::Chunked(state) = self else {
            return Ok(false);
        };
        let Some(end) = line_end(buf) else {
            return if buf.len() > MAX_LINE {
                Err(RelayError::Malformed("chunk framing line too long".into()))
            } else {
                Ok(false)
            };
        };
        let line = &buf[..end];
        let empty = matches!(line, b"\r\n" | b"\n");
        match *state {
            Chunked::Size => {
                let digits = line
                    .iter()
                    .position(|b| !b.is_ascii_hexdigit())
                    .unwrap_or(line.len());
                // A size line is hex digits, then extensions or the CRLF.
                let size = std::str::from_utf8(&line[..digits])
                    .ok()
                    .filter(|d| !d.is_empty() && d.len() <= 15)
                    .and_then(|d| u64::from_str_radix(d, 16).ok())
                    .filter(|_| matches!(line[digits], b';' | b'\r' | b'\n' | b' ' | b'\t'))
                    .ok_or_else(|| {
                        RelayError::Malformed(format!(
                            "chunk size line {:?}",
                            String::from_utf8_lossy(line)
                        ))
                    })?;
                *state = if size == 0 {
                    Chunked::Trailers
                } else {
                    Chunked::Data(size)
                };
            }
            Chunked::DataEnd => {
                if !empty {
                    return Err(RelayError::Malformed(
                        "chunk data longer than its size".into(),
                    ));
                }
                *state = Chunked::Size;
            }
            Chunked::Trailers => {
                if empty {
                    *self = Framing::Done;
                }
            }
            Chunked::Data(_) => return Ok(false),
        }
        buf.advance(end);
        Ok(true)
    }

    /// Moves past framing that is already in `buf` (a chunk's CRLF, the
    /// last chunk, the trailers), stopping before any body bytes, so the
    /// end is known as soon as its bytes have arrived.
    fn settle(&mut self, buf: &mut BytesMut) -> Result<(), RelayError> {
        loop {
            match self {
                Framing::Length(0) => *self = Framing::Done,
                Framing::Chunked(Chunked::Size | Chunked::DataEnd | Chunked::Trailers) => {
                    if !self.frame_line(buf)? {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        }
    }
}

/// A response body read straight from the upstream socket; the connection
/// goes back to the pool when the body ends and is closed if it is dropped
/// before (a client that went away ends the upstream request).
pub struct RelayBody {
    stream: Option<TcpStream>,
    buf: BytesMut,
    framing: Framing,
    keep_alive: bool,
    pool: RelayPool,
    authority: String,
}

impl RelayBody {
    /// Reads framing that has already arrived, and gives the connection
    /// back once the body is over.
    fn settle(&mut self) {
        if self.framing.settle(&mut self.buf).is_err() {
            // Left for the next poll to report.
            return;
        }
        if self.framing == Framing::Done {
            self.release();
        }
    }

    fn release(&mut self) {
        if let Some(stream) = self.stream.take()
            && self.keep_alive
            && self.buf.is_empty()
        {
            self.pool
                .put_idle(std::mem::take(&mut self.authority), stream);
        }
    }
}

impl http_body::Body for RelayBody {
    type Data = Bytes;
    type Error = RelayError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RelayError>>> {
        let this = self.get_mut();
        loop {
            match this.framing.step(&mut this.buf) {
                Ok(Step::Data(data)) => {
                    this.settle();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::End) => {
                    this.release();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => {}
                Err(e) => {
                    this.stream = None;
                    this.framing = Framing::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let Some(stream) = this.stream.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(poll_read_some(stream, cx, &mut this.buf)) {
                Ok(0) if this.framing == Framing::UntilClose => {
                    this.framing = Framing::Done;
                    this.stream = None;
                }
                Ok(0) => {
                    this.stream = None;
                    this.framing = Framing::Done;
                    return Poll::Ready(Some(Err(RelayError::Closed("in the middle of the body"))));
                }
                Ok(_) => {}
                Err(e) => {
                    this.stream = None;
                    this.framing = Framing::Done;
                    return Poll::Ready(Some(Err(RelayError::Io(e))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.framing == Framing::Done
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.framing {
            Framing::Length(n) => http_body::SizeHint::with_exact(n),
            Framing::Done => http_body::SizeHint::with_exact(0),
            _ => http_body::SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;
    use http_body_util::BodyExt;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;

    /// Decodes `wire` fed in pieces cut at `cuts`; the body and whether it ended.
    fn decode_in_pieces(mut framing: Framing, wire: &[u8], cuts: &[usize]) -> (Vec<u8>, bool) {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&wire.len())) {
            buf.extend_from_slice(&wire[at..cut]);
            at = cut;
            loop {
                match framing.step(&mut buf).expect("valid framing") {
                    Step::Data(d) => out.extend_from_slice(&d),
                    Step::More => break,
                    Step::End => return (out, buf.is_empty()),
                }
            }
        }
        (out, false)
    }

    const CHUNKED: &[u8] = b"6\r\ndata: \r\n1a;ext=1\r\n{\"choices\":[{\"text\":\"a\"}]}\r\n2\r\n\n\n\r\n0\r\nx-trailer: 1\r\n\r\n";
    const PAYLOAD: &[u8] = b"data: {\"choices\":[{\"text\":\"a\"}]}\n\n";

    #[test]
    fn chunked_bodies_decode_across_every_packet_boundary() {
        let whole = decode_in_pieces(Framing::Chunked(Chunked::Size), CHUNKED, &[]);
        assert_eq!(whole, (PAYLOAD.to_vec(), true));
        for cut in 1..CHUNKED.len() {
            let got = decode_in_pieces(Framing::Chunked(Chunked::Size), CHUNKED, &[cut]);
            assert_eq!(got, (PAYLOAD.to_vec(), true), "cut at {cut}");
        }
        // One byte at a time.
        let cuts: Vec<usize> = (1..CHUNKED.len()).collect();
        let got = decode_in_pieces(Framing::Chunked(Chunked::Size), CHUNKED, &cuts);
        assert_eq!(got, (PAYLOAD.to_vec(), true));
    }

    #[test]
    fn bad_chunk_framing_is_an_error_not_a_panic() {
        for wire in [
            &b"zz\r\nabc\r\n"[..],
            b"3\r\nabcdef\r\n",
            b"\r\n",
            b"fffffffffffffffff\r\n",
        ] {
            let mut buf = BytesMut::from(wire);
            let mut f = Framing::Chunked(Chunked::Size);
            let mut res = Ok(Step::More);
            for _ in 0..4 {
                res = f.step(&mut buf);
                if !matches!(res, Ok(Step::Data(_))) {
                    break;
                }
            }
            assert!(
                matches!(res, Err(RelayError::Malformed(_))),
                "{:?}: {res:?}",
                String::from_utf8_lossy(wire)
            );
        }
        // A size line that never ends is refused once over the limit.
        let mut buf = BytesMut::from(&[b'1'; MAX_LINE + 1][..]);
        assert!(Framing::Chunked(Chunked::Size).step(&mut buf).is_err());
    }

    #[test]
    fn settling_sees_the_end_before_it_is_polled() {
        // After the last data chunk, the terminator already in the buffer
        // ends the body without another read.
        let mut buf = BytesMut::from(&b"\r\n0\r\n\r\n"[..]);
        let mut f = Framing::Chunked(Chunked::DataEnd);
        f.settle(&mut buf).unwrap();
        assert_eq!((f, buf.len()), (Framing::Done, 0));
        // The next chunk's size is read; its data is left alone.
        let mut buf = BytesMut::from(&b"\r\n3\r\nab"[..]);
        let mut f = Framing::Chunked(Chunked::DataEnd);
        f.settle(&mut buf).unwrap();
        assert_eq!(
            (f, &buf[..]),
            (Framing::Chunked(Chunked::Data(3)), &b"ab"[..])
        );
    }

    #[test]
    fn response_heads_set_the_framing() {
        let parse = |h: &str| parse_head(h.as_bytes(), false).unwrap().unwrap();
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\n";
        let (len, parts, f, keep) = parse(&format!("{head}rest"));
        assert_eq!(
            (len, parts.status, f, keep),
            (
                head.len(),
                StatusCode::OK,
                Framing::Chunked(Chunked::Size),
                true
            )
        );
        assert_eq!(parts.headers["content-type"], "text/event-stream");
        let (_, _, f, keep) = parse("HTTP/1.1 404 Not Found\r\ncontent-length: 12\r\n\r\n");
        assert_eq!((f, keep), (Framing::Length(12), true));
        let (_, _, f, keep) =
            parse("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n");
        assert_eq!((f, keep), (Framing::Length(2), false));
        let (_, _, f, keep) = parse("HTTP/1.0 200 OK\r\n\r\n");
        assert_eq!((f, keep), (Framing::UntilClose, false));
        let (_, _, f, _) = parse("HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n");
        assert_eq!(f, Framing::Length(0));
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-le", false)
                .unwrap()
                .is_none()
        );
        assert!(
            parse_head(
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                false
            )
            .is_err()
        );
        assert!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n", false).is_err());
    }

    /// An upstream that answers each request on a connection with `answer`
    /// (written in pieces, with pauses), counting connections.
    async fn upstream(
        pieces: Vec<&'static [u8]>,
        close_after: bool,
    ) -> (
        String,
        Arc<std::sync::atomic::AtomicUsize>,
        tokio::sync::mpsc::UnboundedReceiver<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        let (closed_tx, closed_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let pieces = pieces.clone();
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    let mut req = vec![0u8; 4096];
                    loop {
                        // One read holds the small request (head and body).
                        match s.read(&mut req).await {
                            Ok(0) | Err(_) => {
                                let _ = closed_tx.send(());
                                return;
                            }
                            Ok(_) => {}
                        }
                        for p in &pieces {
                            if s.write_all(p).await.is_err() {
                                let _ = closed_tx.send(());
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        if close_after {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted, closed_rx)
    }

    async fn post(pool: &RelayPool, addr: &str) -> Result<http::Response<RelayBody>, RelayError> {
        pool.send(
            &Method::POST,
            addr,
            "/v1/completions",
            &HeaderMap::new(),
            Bytes::from_static(b"{}"),
        )
        .await
    }

    #[tokio::test]
    async fn a_stream_split_over_packets_arrives_whole_and_the_connection_is_reused() {
        let (addr, accepted, _) = upstream(
            vec![
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata",
                b": \r\n1a\r",
                b"\n{\"choices\":[{\"text\":\"a\"}]}",
                b"\r\n2\r\n\n\n\r\n0\r\n",
                b"\r\n",
            ],
            false,
        )
        .await;
        let pool = RelayPool::new(Duration::from_secs(1));
        for _ in 0..3 {
            let resp = post(&pool, &addr).await.unwrap();
            assert_eq!(resp.status(), 200);
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], PAYLOAD);
        }
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "one connection, reused"
        );
    }

    #[tokio::test]
    async fn an_upstream_that_closes_mid_stream_is_an_error() {
        let (addr, _, _) = upstream(
            vec![
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n1a\r\n{\"cho",
            ],
            true,
        )
        .await;
        let pool = RelayPool::new(Duration::from_secs(1));
        let mut body = post(&pool, &addr).await.unwrap().into_body();
        let mut got = Vec::new();
        let err = loop {
            match body.frame().await {
                Some(Ok(f)) => got.extend_from_slice(f.data_ref().unwrap()),
                Some(Err(e)) => break e,
                None => panic!("the body ended normally after {got:?}"),
            }
        };
        assert!(matches!(err, RelayError::Closed(_)), "{err:?}");
        assert_eq!(&got[..], b"data: {\"cho");
        assert!(pool.idle().is_empty(), "a broken connection is not pooled");
        // Before the head: an error too (the proxy answers 502).
        let (addr, _, _) = upstream(vec![b"HTTP/1.1 200 OK\r\ncontent-"], true).await;
        assert!(matches!(
            post(&pool, &addr).await,
            Err(RelayError::Closed(_))
        ));
    }

    #[tokio::test]
    async fn dropping_the_body_closes_the_upstream_connection() {
        let (addr, _, mut closed) = upstream(
            vec![
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n",
                b"6\r\nmore..\r\n",
            ],
            false,
        )
        .await;
        let pool = RelayPool::new(Duration::from_secs(1));
        let mut body = post(&pool, &addr).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.data_ref().unwrap(), &b"data: "[..]);
        drop(body);
        tokio::time::timeout(Duration::from_secs(5), closed.recv())
            .await
            .expect("the upstream sees the connection close")
            .unwrap();
        assert!(pool.idle().is_empty());
    }

    #[tokio::test]
    async fn a_pooled_connection_the_upstream_closed_is_replaced() {
        // Answers once per connection, then closes it: the pooled one is dead.
        let (addr, accepted, _) = upstream(
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"],
            true,
        )
        .await;
        let pool = RelayPool::new(Duration::from_secs(1));
        for _ in 0..3 {
            let resp = post(&pool, &addr).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_pooled_connection_closed_as_a_request_leaves_is_replaced_and_the_request_resent_whole()
     {
        // The first connection answers one request, then reads the next and
        // closes without a word (a keep-alive timeout racing the request);
        // later connections answer every request and keep what they read.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (got_tx, mut got) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            let mut first = true;
            while let Ok((mut s, _)) = listener.accept().await {
                let closes = std::mem::take(&mut first);
                let got_tx = got_tx.clone();
                tokio::spawn(async move {
                    let mut answered = 0;
                    let mut req = vec![0u8; 4096];
                    loop {
                        let n = s.read(&mut req).await.unwrap_or(0);
                        if n == 0 || (closes && answered == 1) {
                            return;
                        }
                        let _ = got_tx.send(req[..n].to_vec());
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(ok).await.is_err() {
                            return;
                        }
                        answered += 1;
                    }
                });
            }
        });
        let pool = RelayPool::new(Duration::from_secs(1));
        for _ in 0..2 {
            let resp = tokio::time::timeout(Duration::from_secs(5), post(&pool, &addr))
                .await
                .expect("an answer, not a wait")
                .unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(&body[..], b"ok");
        }
        let first = got.recv().await.unwrap();
        let resent = got.recv().await.unwrap();
        assert!(first.ends_with(b"\r\n\r\n{}"), "{first:?}");
        assert_eq!(
            resent, first,
            "the request went whole over the new connection"
        );
    }

    #[test]
    fn request_heads_carry_host_and_length() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer k"));
        h.insert("content-length", HeaderValue::from_static("999"));
        let head = request_head(&Method::POST, "h:1", "/v1/completions", &h, 7);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "POST /v1/completions HTTP/1.1\r\nhost: h:1\r\nauthorization: Bearer k\r\ncontent-length: 7\r\n\r\n"
        );
        let head = request_head(&Method::GET, "h:1", "/v1/models", &HeaderMap::new(), 0);
        assert_eq!(
            String::from_utf8(head).unwrap(),
            "GET /v1/models HTTP/1.1\r\nhost: h:1\r\n\r\n"
        );
    }
}
