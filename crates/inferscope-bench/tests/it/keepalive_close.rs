//! A server that closes a kept-alive connection right after a streamed
//! response, without `Connection: close` (llama.cpp's `llama-server` does
//! this for every streamed response). A raw-TCP mock reproduces it; the
//! client must not lose the next request to the close, and must not send
//! again a request the server may have read.

use inferscope_bench::client::{ApiClient, ApiKind, ClientConfig, RequestIds, Sampling};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the mock does after reading a request.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    /// Streams a response and closes 20 ms after it, as llama-server does
    /// (the delay lets the client drain the response before the FIN comes).
    AnswerAndClose,
    /// Answers the first request of each connection; closes without an
    /// answer after reading the second (the server saw that request).
    ReadSecondAndClose,
    /// Streams the events through `[DONE]`, ends the chunked body 30 ms
    /// later, and closes at once (the body's end and the FIN arrive
    /// together, after the client has parsed `[DONE]`).
    CloseAfterLateEnd,
    /// Keeps connections alive, and closes one that has been idle for
    /// 1.2 s (an idle timeout, as uvicorn's 5 s).
    CloseWhenIdle,
}

/// The mock's log per request read: (connection number, request number on
/// it, whether it asked for `Connection: close`).
type Log = Arc<Mutex<Vec<(usize, usize, bool)>>>;

/// Reads one request; whether it carried `Connection: close`.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<bool> {
    let mut len = 0usize;
    let mut close = false;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().ok()?;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("connection")
        {
            close = v.trim().eq_ignore_ascii_case("close");
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some(close)
}

fn chunk(s: &str) -> String {
    format!("{:x}\r\n{s}\r\n", s.len())
}

fn respond(w: &mut TcpStream, end_after: Duration) -> std::io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n",
    )?;
    for ev in [
        r#"{"choices":[{"index":0,"text":"a"}]}"#,
        r#"{"choices":[{"index":0,"text":"b","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
        "[DONE]",
    ] {
        w.write_all(chunk(&format!("data: {ev}\n\n")).as_bytes())?;
    }
    std::thread::sleep(end_after);
    w.write_all(b"0\r\n\r\n")
}

/// Serves connections on a thread until the test ends.
fn start(then: Then) -> (u16, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let log: Log = Arc::default();
    let l = log.clone();
    std::thread::spawn(move || {
        for (conn, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            let l = l.clone();
            std::thread::spawn(move || {
                let mut w = stream.try_clone().expect("clone");
                let mut r = BufReader::new(stream);
                for n in 1.. {
                    let Some(close) = read_request(&mut r) else {
                        return;
                    };
                    l.lock().expect("log").push((conn, n, close));
                    if then == Then::ReadSecondAndClose && n == 2 {
                        let _ = w.shutdown(Shutdown::Both);
                        return;
                    }
                    let end_after = match then {
                        Then::CloseAfterLateEnd => Duration::from_millis(30),
                        _ => Duration::ZERO,
                    };
                    if respond(&mut w, end_after).is_err() {
                        return;
                    }
                    if then == Then::CloseAfterLateEnd {
                        let _ = w.shutdown(Shutdown::Both);
                        return;
                    }
                    if then == Then::CloseWhenIdle {
                        // The next read times out: the thread returns and
                        // the connection closes.
                        let _ = w.set_read_timeout(Some(Duration::from_millis(1200)));
                    }
                    if then == Then::AnswerAndClose {
                        std::thread::sleep(Duration::from_millis(20));
                        let _ = w.shutdown(Shutdown::Both);
                        return;
                    }
                }
            });
        }
    });
    (port, log)
}

fn client(port: u16) -> ApiClient {
    ApiClient::new(ClientConfig {
        url: format!("http://127.0.0.1:{port}/v1/completions"),
        api: ApiKind::Completions,
        model: "m".into(),
        ignore_eos: true,
        sampling: Sampling::default(),
        read_timeout: Duration::from_secs(5),
        api_key: None,
        request_ids: RequestIds::Off,
    })
    .expect("client")
}

/// Sends one request and checks that it succeeded.
async fn answered(c: &ApiClient) -> inferscope_bench::client::RequestOutput {
    let out = c.send("p", 3, 2).await;
    assert!(out.success, "request failed: {}", out.error);
    out
}

/// The second request goes to the pooled connection after the server's FIN
/// arrived but before the runtime read it (the thread is blocked meanwhile,
/// as a busy runtime is): it must be sent again on a new connection, once.
#[tokio::test(flavor = "current_thread")]
async fn a_request_on_a_connection_the_server_closed_is_sent_again() {
    let (port, log) = start(Then::AnswerAndClose);
    let c = client(port);
    let first = answered(&c).await;
    assert_eq!(first.resent, 0);
    // Lets the connection task drain the response and park the connection
    // in the pool, then blocks the runtime: the FIN (20 ms after the
    // response) lands unseen.
    tokio::time::sleep(Duration::from_millis(5)).await;
    std::thread::sleep(Duration::from_millis(150));
    let second = answered(&c).await;
    assert_eq!(
        second.resent,
        1,
        "resent on a fresh connection once; server log {:?}",
        log.lock().expect("log")
    );
    assert_eq!(second.generated_text, "ab");
    assert_eq!(second.usage_output_tokens, Some(2));
    // Once the client has seen a close, each request asks for a connection
    // of its own, so none can be written into one the server is closing.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let third = answered(&c).await;
    assert_eq!(third.resent, 0);
    // The server read each request once, each on its own connection.
    assert_eq!(
        *log.lock().expect("log"),
        vec![(0, 1, false), (1, 1, false), (2, 1, true)]
    );
}

/// A request the server read before closing is a failure, not a resend:
/// the client cannot know whether the server ran it.
#[tokio::test(flavor = "current_thread")]
async fn a_request_the_server_read_is_not_sent_again() {
    let (port, log) = start(Then::ReadSecondAndClose);
    let c = client(port);
    answered(&c).await;
    let second = c.send("p", 3, 2).await;
    assert!(!second.success);
    assert_eq!(second.resent, 0);
    assert!(
        second
            .error
            .contains("connection closed before message completed"),
        "{}",
        second.error
    );
    assert_eq!(
        *log.lock().expect("log"),
        vec![(0, 1, false), (0, 2, false)]
    );
}

/// The client reads a stream to its end after `[DONE]`, so it sees the
/// server close the connection (and later requests ask for their own):
/// dropping the body at `[DONE]` closed the connection from the client's
/// side, and the server's habit went unnoticed.
#[tokio::test(flavor = "current_thread")]
async fn a_close_after_the_end_of_a_stream_is_seen() {
    let (port, log) = start(Then::CloseAfterLateEnd);
    let c = client(port);
    let first = answered(&c).await;
    assert_eq!(first.generated_text, "ab");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        c.server_closes_connections(),
        "the server's close after the stream was not seen"
    );
    let second = answered(&c).await;
    assert_eq!(second.resent, 0);
    assert_eq!(*log.lock().expect("log"), vec![(0, 1, false), (1, 1, true)]);
}

/// A server that closes a connection only once it has been idle (past
/// `CLOSE_AFTER_RESPONSE` after the response) does not turn the run to
/// `Connection: close`: the next request simply gets a new connection.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_timeout_close_keeps_connections_alive() {
    let (port, log) = start(Then::CloseWhenIdle);
    let c = client(port);
    answered(&c).await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(
        !c.server_closes_connections(),
        "an idle timeout was taken for a close after every response"
    );
    for _ in 0..2 {
        answered(&c).await;
    }
    // The second connection is kept alive for the third request.
    assert_eq!(
        *log.lock().expect("log"),
        vec![(0, 1, false), (1, 1, false), (1, 2, false)]
    );
}
