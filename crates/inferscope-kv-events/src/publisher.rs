//! The ZeroMQ publisher: one thread per engine, a bounded queue in front.

use std::collections::VecDeque;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use bytes::Bytes;
use inferscope_engine::{KvEventBatch, KvEventSink};
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::config::{KvEventsConfig, binds, offset_endpoint};
use crate::encode::encode_batch;

/// The replay socket's end marker: sequence number -1, empty payload.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublisherError {
    /// A bad endpoint (checked before any socket opens).
    #[error("--kv-events-config: {0}")]
    Config(String),
    /// A socket could not bind or connect.
    #[error("KV events: cannot open {endpoint}: {message}")]
    Socket {
        /// The endpoint.
        endpoint: String,
        /// The socket error.
        message: String,
    },
    /// The publisher thread could not start.
    #[error("KV events: cannot start the publisher thread: {0}")]
    Thread(String),
}

/// The engines' [`KvEventSink`]: routes each batch to its engine's queue.
#[derive(Debug)]
pub struct KvEventPublisher {
    /// (global engine index, its queue).
    queues: Vec<(usize, mpsc::Sender<KvEventBatch>)>,
    /// Where each engine publishes (PUB, replay), for logs and tests.
    endpoints: Vec<(String, Option<String>)>,
}

impl KvEventSink for KvEventPublisher {
    fn try_publish(&self, batch: KvEventBatch) -> bool {
        self.queues
            .iter()
            .find(|(e, _)| *e == batch.engine)
            .is_some_and(|(_, tx)| tx.try_send(batch).is_ok())
    }
}

impl KvEventPublisher {
    /// Opens one PUB (and replay ROUTER) socket per engine of `engines`
    /// (global indices, in process order: the i-th one's ports are the
    /// configured ones plus i) and starts their threads. Returns once every
    /// socket is bound or connected, or with the first failure.
    pub fn start(config: &KvEventsConfig, engines: &[usize]) -> Result<Self, PublisherError> {
        let mut queues = Vec::with_capacity(engines.len());
        let mut endpoints = Vec::with_capacity(engines.len());
        for (i, &engine) in engines.iter().enumerate() {
            let endpoint = offset_endpoint(&config.endpoint, i).map_err(PublisherError::Config)?;
            let replay = config
                .replay_endpoint
                .as_deref()
                .map(|r| offset_endpoint(r, i))
                .transpose()
                .map_err(PublisherError::Config)?;
            let (tx, rx) = mpsc::channel(config.max_queue_size);
            let (ready_tx, ready_rx) = std_mpsc::channel();
            let worker = Worker {
                endpoint: endpoint.clone(),
                replay_endpoint: replay.clone(),
                topic: Bytes::from(config.topic.clone().into_bytes()),
                buffer_steps: config.buffer_steps,
                rx,
            };
            std::thread::Builder::new()
                .name(format!("kv-events-{engine}"))
                .spawn(move || worker.run(ready_tx))
                .map_err(|e| PublisherError::Thread(e.to_string()))?;
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(PublisherError::Thread("it exited at start".into())),
            }
            tracing::info!(engine, %endpoint, replay = ?replay, "publishing KV-cache events");
            queues.push((engine, tx));
            endpoints.push((endpoint, replay));
        }
        Ok(Self { queues, endpoints })
    }

    /// Each engine's (PUB, replay) endpoints, in process order.
    pub fn endpoints(&self) -> &[(String, Option<String>)] {
        &self.endpoints
    }
}

struct Worker {
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: Bytes,
    buffer_steps: usize,
    rx: mpsc::Receiver<KvEventBatch>,
}

/// ZeroMQ addresses with `*` mean every interface; the socket wants an IP.
fn socket_addr(endpoint: &str) -> String {
    endpoint.replacen("tcp://*:", "tcp://0.0.0.0:", 1)
}

impl Worker {
    fn run(self, ready: std_mpsc::Sender<Result<(), PublisherError>>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                let _ = ready.send(Err(PublisherError::Thread(e.to_string())));
                return;
            }
        };
        rt.block_on(self.serve(ready));
    }

    async fn serve(mut self, ready: std_mpsc::Sender<Result<(), PublisherError>>) {
        let sock_err = |endpoint: &str, e: zeromq::ZmqError| PublisherError::Socket {
            endpoint: endpoint.to_owned(),
            message: e.to_string(),
        };
        // Bound at once; a connecting socket connects in the background while
        // batches are encoded and buffered for replay (nobody would get
        // them before the connection anyway).
        let mut publisher = None;
        if binds(&self.endpoint) {
            let mut socket = PubSocket::new();
            if let Err(e) = socket.bind(&socket_addr(&self.endpoint)).await {
                let mut err = sock_err(&self.endpoint, e);
                // `tcp://[::1]:p` reads like a connect but binds (vLLM's
                // rule): say so, since a subscriber that bound `p` itself
                // is the likely reason the port is taken.
                if let PublisherError::Socket { message, .. } = &mut err
                    && self.endpoint.contains("::")
                    && !self.endpoint.contains("[::]")
                {
                    message.push_str(
                        " (an endpoint containing `::` binds, as in vLLM; to connect to an IPv6 peer use its host name)",
                    );
                }
                let _ = ready.send(Err(err));
                return;
            }
            publisher = Some(socket);
        }
        let mut replay = None;
        if let Some(r) = &self.replay_endpoint {
            let mut router = RouterSocket::new();
            if let Err(e) = router.bind(&socket_addr(r)).await {
                let _ = ready.send(Err(sock_err(r, e)));
                return;
            }
            replay = Some(router);
        }
        let _ = ready.send(Ok(()));
        let endpoint = self.endpoint.clone();
        let connecting = async move {
            let mut wait = Duration::from_millis(100);
            loop {
                let mut socket = PubSocket::new();
                match socket.connect(&endpoint).await {
                    Ok(()) => return socket,
                    Err(e) => {
                        tracing::warn!(%endpoint, error = %e, "KV events: cannot connect yet; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(5));
                    }
                }
            }
        };
        tokio::pin!(connecting);

        let mut seq: u64 = 0;
        let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
        loop {
            tokio::select! {
                batch = self.rx.recv() => {
                    // None: every engine core is gone.
                    let Some(batch) = batch else { break };
                    let payload = Bytes::from(encode_batch(&batch));
                    let frames = vec![
                        self.topic.clone(),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payload.clone(),
                    ];
                    if let Some(publisher) = publisher.as_mut()
                        && let Ok(msg) = ZmqMessage::try_from(frames)
                        && let Err(e) = publisher.send(msg).await
                    {
                        tracing::warn!(error = %e, seq, "KV events: send failed (kept for replay)");
                    }
                    if self.buffer_steps > 0 {
                        if buffer.len() == self.buffer_steps {
                            buffer.pop_front();
                        }
                        buffer.push_back((seq, payload));
                    }
                    seq += 1;
                }
                socket = &mut connecting, if publisher.is_none() => {
                    tracing::info!(endpoint = %self.endpoint, "KV events: connected");
                    publisher = Some(socket);
                }
                request = next_request(&mut replay) => {
                    if let (Ok(request), Some(router)) = (request, replay.as_mut()) {
                        serve_replay(router, request, &buffer).await;
                    }
                }
            }
        }
    }
}

async fn next_request(replay: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// vLLM's replay protocol: the request is `[identity, "", start_seq (8 bytes
/// big-endian)]`; the answer is one `[identity, "", seq, payload]` per
/// buffered batch from `start_seq` on, then `[identity, "", -1, ""]`.
async fn serve_replay(
    router: &mut RouterSocket,
    request: ZmqMessage,
    buffer: &VecDeque<(u64, Bytes)>,
) {
    let frames = request.into_vec();
    let start = match frames.as_slice() {
        [_, _, seq] if seq.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(seq);
            u64::from_be_bytes(b)
        }
        _ => {
            tracing::warn!(
                frames = frames.len(),
                "KV events: invalid replay request ignored"
            );
            return;
        }
    };
    let id = frames[0].clone();
    let replies = buffer
        .iter()
        .filter(|(s, _)| *s >= start)
        .map(|(s, p)| {
            vec![
                id.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&s.to_be_bytes()),
                p.clone(),
            ]
        })
        .chain(std::iter::once(vec![
            id.clone(),
            Bytes::new(),
            Bytes::from_static(&END_SEQ),
            Bytes::new(),
        ]));
    for frames in replies {
        let Ok(msg) = ZmqMessage::try_from(frames) else {
            continue;
        };
        if let Err(e) = router.send(msg).await {
            tracing::warn!(error = %e, "KV events: replay answer not sent");
            return;
        }
    }
}
