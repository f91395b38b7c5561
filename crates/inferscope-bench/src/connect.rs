//! The client's TCP connector: hyper's `HttpConnector`, with each stream
//! checked for a server-side close right before a request starts on it.
//!
//! Why: a server may close a kept-alive connection right after a response
//! without saying so (llama.cpp's `llama-server` closes every streamed
//! response's connection while announcing `Keep-Alive: timeout=5, max=100`).
//! hyper's pool only learns of the close when its connection task reads the
//! FIN, which under load can be milliseconds later; a request handed to the
//! connection in between is written into a closed connection and fails with
//! "connection closed before message completed", although the server never
//! saw it. Here the first write of each request asks the kernel whether the
//! peer has already closed; if so nothing is written and the request fails
//! with [`UnsentRequest`], which the caller may safely send again.

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The error of a request that was not written because the server had
/// already closed (or reset) the connection: none of its bytes were sent.
#[derive(Debug)]
pub struct UnsentRequest {
    /// What the kernel reported: the server's FIN or a reset.
    pub reason: &'static str,
}

impl std::fmt::Display for UnsentRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server had closed this kept-alive connection ({}) before the request was written; none of it was sent",
            self.reason
        )
    }
}

impl std::error::Error for UnsentRequest {}

/// True when `err` (or one of its causes) is an [`UnsentRequest`]: the
/// request provably never reached the server.
pub fn never_sent(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<UnsentRequest>() {
            return true;
        }
        // io::Error's `source()` skips its own payload: look inside.
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<UnsentRequest>())
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Whether a write starts a request head. The bench client sends only
/// `GET` and `POST` with JSON bodies (which start with `{`), so a write
/// that starts with one of these methods and a space is a request's first
/// bytes, unless it continues a partial write (tracked by the caller).
fn starts_request(buf: &[u8]) -> bool {
    buf.starts_with(b"POST ") || buf.starts_with(b"GET ")
}

/// How soon after the server's last bytes its close counts as closing
/// after every response (llama-server's, within milliseconds) rather than
/// an idle timeout (uvicorn's 5 s, nginx's 75 s), which the peek before a
/// write covers without giving up kept-alive connections.
pub const CLOSE_AFTER_RESPONSE: Duration = Duration::from_secs(1);

/// A TCP stream that refuses to start a request on a connection the peer
/// has already closed.
#[derive(Debug)]
pub struct GuardedStream {
    tcp: TcpStream,
    /// Set when the peer ends the stream (a read returns end of file)
    /// within [`CLOSE_AFTER_RESPONSE`] of its last bytes.
    peer_closed_one: Arc<AtomicBool>,
    /// When a read last returned bytes.
    last_data: Option<Instant>,
    /// The last write took fewer bytes than offered: the next one continues
    /// it, so it is not the start of a request even if it looks like one.
    mid_write: bool,
}

impl GuardedStream {
    /// Wraps a connected stream; `peer_closed_one` is set at the peer's FIN.
    pub fn new(tcp: TcpStream, peer_closed_one: Arc<AtomicBool>) -> Self {
        GuardedStream {
            tcp,
            peer_closed_one,
            last_data: None,
            mid_write: false,
        }
    }

    /// Asks the kernel (not tokio's cached readiness, which is what lags)
    /// whether the peer has closed: a non-blocking `MSG_PEEK` on a
    /// duplicate of the socket returns 0 at the peer's FIN. `None` when the
    /// connection looks open or the check itself failed (then nothing is
    /// claimed and the write goes ahead).
    fn peer_closed(&self) -> Option<UnsentRequest> {
        let fd = self.tcp.as_fd().try_clone_to_owned().ok()?;
        // Shares the socket and its O_NONBLOCK; dropping it closes only the duplicate.
        let probe = std::net::TcpStream::from(fd);
        let mut byte = [0u8; 1];
        match probe.peek(&mut byte) {
            Ok(0) => Some(UnsentRequest {
                reason: "it had sent its FIN",
            }),
            Ok(_) => None,
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset) => Some(UnsentRequest {
                reason: "it had reset it",
            }),
            Err(_) => None,
        }
    }

    /// The check before a write of `first` (the first bytes offered).
    fn check(&self, first: &[u8]) -> Result<(), io::Error> {
        if !self.mid_write
            && starts_request(first)
            && let Some(unsent) = self.peer_closed()
        {
            return Err(io::Error::new(io::ErrorKind::ConnectionAborted, unsent));
        }
        Ok(())
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) {
            if buf.filled().len() > before {
                self.last_data = Some(Instant::now());
            } else if buf.remaining() > 0
                && self
                    .last_data
                    .is_some_and(|t| t.elapsed() < CLOSE_AFTER_RESPONSE)
            {
                self.peer_closed_one.store(true, Ordering::Relaxed);
            }
        }
        r
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check(buf) {
            return Poll::Ready(Err(e));
        }
        let r = Pin::new(&mut self.tcp).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.mid_write = n < buf.len();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        if let Err(e) = self.check(first) {
            return Poll::Ready(Err(e));
        }
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let r = Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r {
            self.mid_write = n < total;
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

impl Connection for GuardedStream {
    fn connected(&self) -> Connected {
        self.tcp.connected()
    }
}

/// `HttpConnector` whose streams are [`GuardedStream`]s.
#[derive(Debug, Clone)]
pub struct GuardedConnector {
    inner: HttpConnector,
    peer_closed_one: Arc<AtomicBool>,
}

impl GuardedConnector {
    /// Wraps a configured `HttpConnector`.
    pub fn new(inner: HttpConnector) -> Self {
        GuardedConnector {
            inner,
            peer_closed_one: Arc::default(),
        }
    }

    /// Set once the server has closed any of this connector's connections
    /// right after a response (within [`CLOSE_AFTER_RESPONSE`] of its last
    /// bytes); shared by its clones, so by the pool that owns one.
    pub fn peer_closes(&self) -> Arc<AtomicBool> {
        self.peer_closed_one.clone()
    }
}

impl tower::Service<Uri> for GuardedConnector {
    type Response = TokioIo<GuardedStream>;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let connecting = self.inner.call(dst);
        let flag = self.peer_closed_one.clone();
        Box::pin(async move {
            let io = connecting.await?;
            Ok(TokioIo::new(GuardedStream::new(io.into_inner(), flag)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_are_recognised() {
        assert!(starts_request(b"POST /v1/completions HTTP/1.1\r\n"));
        assert!(starts_request(b"GET /v1/models HTTP/1.1\r\n"));
        assert!(!starts_request(b"{\"model\":\"m\"}"));
        assert!(!starts_request(b"content-type: application/json\r\n"));
        assert!(!starts_request(b""));
    }

    #[test]
    fn unsent_is_found_inside_io_and_hyper_chains() {
        let io = io::Error::new(
            io::ErrorKind::ConnectionAborted,
            UnsentRequest { reason: "x" },
        );
        assert!(never_sent(&io));
        let other = io::Error::new(io::ErrorKind::ConnectionReset, "reset by peer");
        assert!(!never_sent(&other));
    }
}
