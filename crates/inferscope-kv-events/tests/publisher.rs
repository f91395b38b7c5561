//! The publisher on real sockets: three-frame messages on PUB, replay on ROUTER.

use std::time::Duration;

use inferscope_engine::{KvEvent, KvEventBatch, KvEventSink};
use inferscope_kv_events::publisher::END_SEQ;
use inferscope_kv_events::{KvEventPublisher, KvEventsConfig};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn batch(engine: usize, hash: u64) -> KvEventBatch {
    KvEventBatch {
        ts: 1.5,
        engine,
        events: vec![KvEvent::BlockRemoved {
            block_hashes: vec![hash],
        }],
    }
}

fn removed_hash(payload: &[u8]) -> u64 {
    let mut r = payload;
    let v = rmpv::decode::read_value(&mut r).unwrap();
    let ev = &v.as_array().unwrap()[1].as_array().unwrap()[0];
    ev.as_array().unwrap()[1].as_array().unwrap()[0]
        .as_u64()
        .unwrap()
}

fn seq(frame: &[u8]) -> i64 {
    i64::from_be_bytes(frame.try_into().expect("8 bytes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_three_frames_and_replays_from_a_sequence_number() {
    let (p, r) = (free_port(), free_port());
    let config = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{p}",
            "replay_endpoint": "tcp://*:{r}", "topic": "kv@t@m", "buffer_steps": 3}}"#
    ))
    .unwrap();
    let publisher = KvEventPublisher::start(&config, &[7]).unwrap();

    let mut sub = SubSocket::new();
    sub.connect(&format!("tcp://127.0.0.1:{p}")).await.unwrap();
    sub.subscribe("").await.unwrap();
    // A PUB socket drops what it sends before the subscription arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;

    assert!(
        !publisher.try_publish(batch(0, 1)),
        "no queue for an unknown engine"
    );
    for h in 100..105 {
        assert!(publisher.try_publish(batch(7, h)));
    }
    for (i, h) in (100..105).enumerate() {
        let msg = tokio::time::timeout(Duration::from_secs(5), sub.recv())
            .await
            .expect("a message")
            .unwrap()
            .into_vec();
        assert_eq!(msg.len(), 3, "topic, sequence number, payload");
        assert_eq!(&msg[0][..], b"kv@t@m");
        assert_eq!(seq(&msg[1]), i as i64);
        assert_eq!(removed_hash(&msg[2]), h);
        let v = rmpv::decode::read_value(&mut &msg[2][..]).unwrap();
        assert_eq!(
            v.as_array().unwrap()[2].as_u64(),
            Some(7),
            "data-parallel rank"
        );
    }

    // Replay from 3: the buffer holds the last 3 batches (2, 3, 4).
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&format!("tcp://127.0.0.1:{r}"))
        .await
        .unwrap();
    let mut req = ZmqMessage::from(Vec::<u8>::new());
    req.push_back(3u64.to_be_bytes().to_vec().into());
    dealer.send(req).await.unwrap();
    let mut got = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(5), dealer.recv())
            .await
            .expect("a replay answer")
            .unwrap()
            .into_vec();
        assert_eq!(msg.len(), 3, "empty delimiter, sequence number, payload");
        assert!(msg[0].is_empty());
        if msg[1][..] == END_SEQ {
            assert!(msg[2].is_empty());
            break;
        }
        got.push((seq(&msg[1]), removed_hash(&msg[2])));
    }
    assert_eq!(got, vec![(3, 103), (4, 104)]);

    // From 0: only what the buffer still holds.
    let mut req = ZmqMessage::from(Vec::<u8>::new());
    req.push_back(0u64.to_be_bytes().to_vec().into());
    dealer.send(req).await.unwrap();
    let mut seqs = Vec::new();
    loop {
        let msg = dealer.recv().await.unwrap().into_vec();
        if msg[1][..] == END_SEQ {
            break;
        }
        seqs.push(seq(&msg[1]));
    }
    assert_eq!(seqs, vec![2, 3, 4]);
}

#[test]
fn a_taken_port_fails_at_start() {
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let config = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{port}"}}"#
    ))
    .unwrap();
    let err = KvEventPublisher::start(&config, &[0])
        .unwrap_err()
        .to_string();
    assert!(err.contains(&port.to_string()), "{err}");
}

#[test]
fn a_full_queue_refuses_at_once() {
    let port = free_port();
    let config = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://*:{port}", "max_queue_size": 2}}"#
    ))
    .unwrap();
    let publisher = KvEventPublisher::start(&config, &[0]).unwrap();
    // The thread drains concurrently: push until refused, which must come
    // fast, never a wait.
    let start = std::time::Instant::now();
    let mut refused = 0;
    for h in 0..100_000 {
        if !publisher.try_publish(batch(0, h)) {
            refused += 1;
        }
    }
    assert!(
        refused > 0,
        "a queue of 2 must refuse some of 100000 batches"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// Connect mode (a named host): the publisher dials a subscriber that bound
/// the port, as llm-d's picker does with one socket for all pods. A PUB
/// socket drops what it sends before the subscription arrives, so batches
/// go out until one is received; every one received must be intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_mode_delivers_to_a_subscriber_that_binds() {
    let p = free_port();
    let mut sub = SubSocket::new();
    sub.bind(&format!("tcp://127.0.0.1:{p}")).await.unwrap();
    sub.subscribe("kv@").await.unwrap();
    let config = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://127.0.0.1:{p}", "topic": "kv@c@m"}}"#
    ))
    .unwrap();
    let publisher = KvEventPublisher::start(&config, &[3]).unwrap();
    assert_eq!(publisher.endpoints()[0].0, format!("tcp://127.0.0.1:{p}"));

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut sent = 0u64;
    let msg = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing arrived after {sent} batches"
        );
        assert!(publisher.try_publish(batch(3, 1000 + sent)));
        sent += 1;
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(100), sub.recv()).await {
            break m.unwrap().into_vec();
        }
    };
    assert_eq!(&msg[0][..], b"kv@c@m");
    let s = seq(&msg[1]);
    assert!((0..sent as i64).contains(&s), "sequence {s} of {sent} sent");
    assert_eq!(
        removed_hash(&msg[2]),
        1000 + s as u64,
        "the batch of that sequence number"
    );
    // Once connected and subscribed, the next batches all arrive, in order.
    for h in 0..5 {
        assert!(publisher.try_publish(batch(3, 5000 + h)));
    }
    let mut got = Vec::new();
    while got.len() < 5 {
        let m = tokio::time::timeout(Duration::from_secs(5), sub.recv())
            .await
            .expect("the batches after the first")
            .unwrap()
            .into_vec();
        let h = removed_hash(&m[2]);
        if h >= 5000 {
            got.push(h);
        }
    }
    assert_eq!(got, (5000..5005).collect::<Vec<_>>());
}

/// An IPv6 literal binds (vLLM's rule), so dialing a subscriber that bound
/// `[::1]:p` fails at start, and the error says why.
#[test]
fn an_ipv6_literal_binds_and_the_error_says_so() {
    let Ok(held) = std::net::TcpListener::bind("[::1]:0") else {
        return; // no IPv6 loopback here
    };
    let port = held.local_addr().unwrap().port();
    let config = KvEventsConfig::parse(&format!(
        r#"{{"enable_kv_cache_events": true, "endpoint": "tcp://[::1]:{port}"}}"#
    ))
    .unwrap();
    let err = KvEventPublisher::start(&config, &[0])
        .unwrap_err()
        .to_string();
    assert!(err.contains("binds") && err.contains("host name"), "{err}");
}
