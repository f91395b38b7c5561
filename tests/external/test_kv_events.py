"""KV-cache events as vLLM publishes them, consumed as llm-d's router does.

The server runs the sim executor with a small KV cache (so the workload evicts)
and `--kv-events-config`; its PUB socket binds on the IPv6 loopback `[::1]`
(vLLM's rule: an endpoint with `*` or `::` binds; loopback keeps the test
local) and this test's SUB socket connects to it. The
test decodes every message as vLLM's msgspec structs define it (array-like,
tagged by class name), rebuilds the engine's set of cached block hashes, and
compares it with `GET /debug/kv_cache_blocks`, the engine's own set.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import msgpack
import pytest
import requests
import zmq

from conftest import MODEL, Server, free_port

BLOCK_SIZE = 4
END_SEQ = (-1).to_bytes(8, "big", signed=True)


# vLLM's structs (vllm/distributed/kv_events.py), field order as declared there;
# trailing fields with defaults may be absent (msgspec omit_defaults).
@dataclass
class BlockStored:
    block_hashes: list
    parent_block_hash: int | None
    token_ids: list
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


@dataclass
class BlockRemoved:
    block_hashes: list
    medium: str | None
    group_idx: int | None = None


@dataclass
class AllBlocksCleared:
    pass


@dataclass
class KVEventBatch:
    ts: float
    events: list
    data_parallel_rank: int | None = None


TAGS = {c.__name__: c for c in (BlockStored, BlockRemoved, AllBlocksCleared)}


def decode_batch(payload: bytes) -> KVEventBatch:
    raw = msgpack.unpackb(payload, raw=False)
    assert isinstance(raw, list), f"KVEventBatch must be array-like, got {type(raw)}"
    batch = KVEventBatch(*raw)
    events = []
    for ev in batch.events:
        assert isinstance(ev, list) and ev and ev[0] in TAGS, f"bad tagged event {ev!r}"
        events.append(TAGS[ev[0]](*ev[1:]))  # too many fields raises TypeError
    batch.events = events
    return batch


@dataclass
class Consumer:
    """Rebuilds one engine's cached block set from event batches."""
    blocks: set = field(default_factory=set)
    last_seq: int = -1
    stored: int = 0
    removed: int = 0
    cleared: int = 0

    def apply(self, seq: int, batch: KVEventBatch) -> None:
        assert seq == self.last_seq + 1, f"sequence gap: {self.last_seq} then {seq}"
        self.last_seq = seq
        assert batch.data_parallel_rank == 0
        assert batch.ts > 1e9
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                assert ev.block_size == BLOCK_SIZE
                assert len(ev.token_ids) == BLOCK_SIZE * len(ev.block_hashes)
                assert ev.medium == "GPU" and ev.lora_id is None
                # The parent may be gone already: a request whose block was a
                # duplicate of another's extends a chain the cache evicted.
                new = set(ev.block_hashes)
                assert not new & self.blocks, "stored twice without a removal"
                self.blocks |= new
                self.stored += len(new)
            elif isinstance(ev, BlockRemoved):
                gone = set(ev.block_hashes)
                assert gone <= self.blocks, "removal of a block never stored"
                self.blocks -= gone
                self.removed += len(gone)
            else:
                self.blocks.clear()
                self.cleared += 1


class Subscriber:
    """A SUB socket for the server's PUB socket on [::1]:port."""

    def __init__(self, ctx: zmq.Context, topic: str):
        self.port = free_port()
        self.topic = topic.encode()
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.IPV6, 1)

    def connect(self) -> None:
        self.sock.connect(f"tcp://[::1]:{self.port}")
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")

    def drain(self, quiet: float = 0.7, timeout: float = 30.0) -> list[tuple[int, KVEventBatch]]:
        """Every message until none arrives for `quiet` seconds."""
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sock.poll(int(quiet * 1000)):
                return out
            topic, seq, payload = self.sock.recv_multipart()
            assert topic == self.topic
            assert len(seq) == 8
            out.append((int.from_bytes(seq, "big"), decode_batch(payload)))
        raise AssertionError("the event stream never went quiet")


def replay(ctx: zmq.Context, endpoint: str, start: int) -> list[tuple[int, KVEventBatch]]:
    """vLLM's replay protocol: send the start sequence number, read until -1."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while True:
            assert dealer.poll(10_000), "no replay answer"
            empty, seq, payload = dealer.recv_multipart()
            assert empty == b""
            if seq == END_SEQ:
                assert payload == b""
                return out
            out.append((int.from_bytes(seq, "big"), decode_batch(payload)))
    finally:
        dealer.close(linger=0)


def engine_blocks(server: Server) -> set:
    r = requests.get(server.base + "/debug/kv_cache_blocks", timeout=10)
    r.raise_for_status()
    (engine,) = r.json()["engines"]
    assert engine["engine"] == 0
    return set(engine["block_hashes"])


def workload(server: Server, seed: int, n: int = 24) -> None:
    """Shared prefixes, exact repeats and distinct long prompts, 4 at a time:
    the cache (64 blocks) overflows, so blocks are stored, hit and evicted."""
    system = "You are a terse assistant. " * 3
    prompts = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            prompts.append(system + f"question {seed}-{i}")
        elif kind == 1:
            prompts.append(system + "the same question every time")
        else:
            prompts.append(f"distinct {seed}-{i} " + "lorem ipsum dolor " * (4 + i % 5))
    errors = []

    def run(chunk):
        for p in chunk:
            try:
                r = requests.post(server.base + "/v1/completions", timeout=60, json={
                    "model": MODEL, "prompt": p, "max_tokens": 6, "temperature": 0})
                if r.status_code != 200:
                    errors.append(r.text)
            except requests.RequestException as e:
                errors.append(str(e))

    threads = [threading.Thread(target=run, args=(prompts[k::4],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def start(workdir, sub: Subscriber, replay_port: int) -> Server:
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://[::1]:{sub.port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}",
        "topic": sub.topic.decode(),
        "buffer_steps": 10000,
    }
    server = Server(["--sim-profile", "tiny,kv_tokens=256", "--block-size", str(BLOCK_SIZE),
                     "--kv-events-config", json.dumps(config)], workdir)
    sub.connect()
    # A PUB socket drops what it sends before the subscription reaches it.
    time.sleep(0.5)
    return server


def test_events_rebuild_the_engines_cached_blocks(workdir, ctx):
    sub = Subscriber(ctx, f"kv@127.0.0.1@{MODEL}")
    server = start(workdir, sub, free_port())
    try:
        consumer = Consumer()
        workload(server, seed=1)
        for seq, batch in sub.drain():
            consumer.apply(seq, batch)
        assert consumer.stored > 64, "the workload stores more blocks than the cache holds"
        assert consumer.removed > 0, "the workload must evict"
        expected = engine_blocks(server)
        assert expected, "something stays cached"
        assert consumer.blocks == expected

        # A reset publishes AllBlocksCleared; the engine's set is then empty.
        assert requests.post(server.base + "/reset_prefix_cache", timeout=10).status_code == 200
        for seq, batch in sub.drain():
            consumer.apply(seq, batch)
        assert consumer.cleared == 1
        assert consumer.blocks == set() == engine_blocks(server)
        workload(server, seed=2, n=6)
        for seq, batch in sub.drain():
            consumer.apply(seq, batch)
        assert consumer.blocks == engine_blocks(server) != set()
    finally:
        server.stop()


def test_replay_fills_a_missed_range(workdir, ctx):
    sub = Subscriber(ctx, f"kv@127.0.0.1@{MODEL}")
    replay_port = free_port()
    server = start(workdir, sub, replay_port)
    try:
        consumer = Consumer()
        workload(server, seed=3, n=9)
        for seq, batch in sub.drain():
            consumer.apply(seq, batch)
        seen = consumer.last_seq
        assert seen >= 0

        # Miss a range: unsubscribed, the PUB socket sends this subscriber nothing.
        sub.sock.setsockopt(zmq.UNSUBSCRIBE, b"")
        time.sleep(0.3)
        workload(server, seed=4, n=12)
        assert sub.drain(quiet=0.5) == [], "unsubscribed, nothing arrives"
        sub.sock.setsockopt(zmq.SUBSCRIBE, b"")
        time.sleep(0.3)
        workload(server, seed=5, n=6)
        live = sub.drain()
        assert live, "events after resubscribing"
        first_live = live[0][0]
        assert first_live > seen + 1, "a range was missed"
        with pytest.raises(AssertionError, match="sequence gap"):
            Consumer(last_seq=seen).apply(*live[0])

        # Replay from the first missed sequence number fills the gap exactly.
        replayed = replay(ctx, f"tcp://127.0.0.1:{replay_port}", seen + 1)
        assert [s for s, _ in replayed][:first_live - seen - 1] == list(range(seen + 1, first_live))
        for seq, batch in replayed:
            if seq < first_live:
                consumer.apply(seq, batch)
        # The replayed copies of live batches are the same bytes' decoding.
        overlap = {s: b for s, b in replayed if s >= first_live}
        for seq, batch in live:
            if seq in overlap:
                assert overlap[seq] == batch
            consumer.apply(seq, batch)
        assert consumer.blocks == engine_blocks(server)
    finally:
        server.stop()


def test_connect_mode_delivers_to_a_subscriber_that_binds(workdir, ctx):
    """A named host connects (vLLM's rule): the server dials this test's SUB
    socket, which bound the port first, as llm-d's picker does with one
    `zmqEndpoint` for every pod. The events still rebuild the engine's set."""
    sock = ctx.socket(zmq.SUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
    topic = f"kv@127.0.0.1@{MODEL}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://127.0.0.1:{port}", "topic": topic}
    server = Server(["--sim-profile", "tiny,kv_tokens=256", "--block-size", str(BLOCK_SIZE),
                     "--kv-events-config", json.dumps(config)], workdir)
    try:
        # libzmq processes a socket's commands only inside calls on that
        # socket, from the thread that owns it: the publisher's connection is
        # attached, and this socket's subscription sent to it, when the socket
        # is polled. So poll while the server connects, as a subscriber's
        # receive loop does (a bare sleep here left the subscription unsent
        # until the workload's events had all been dropped).
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            sock.poll(50)
        workload(server, seed=6)
        consumer = Consumer()
        deadline = time.monotonic() + 30
        while sock.poll(700):
            assert time.monotonic() < deadline, "the event stream never went quiet"
            t, seq, payload = sock.recv_multipart()
            assert t == topic.encode() and len(seq) == 8
            consumer.apply(int.from_bytes(seq, "big"), decode_batch(payload))
        assert consumer.stored > 64 and consumer.removed > 0, "stored and evicted"
        assert consumer.blocks == engine_blocks(server) != set()
    finally:
        server.stop()
        sock.close(linger=0)


def test_bad_kv_events_config_is_refused(workdir):
    from conftest import INFERSCOPE_BIN
    import subprocess
    out = subprocess.run([str(INFERSCOPE_BIN), "serve", "--executor", "sim", "--port", "0",
                          "--host", "127.0.0.1",
                          "--kv-events-config", '{"enable_kv_cache_events": true, "endpoint": "ipc:///x"}'],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "tcp://" in out.stdout + out.stderr
