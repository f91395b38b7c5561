"""Tenants on `inferscope proxy` in front of llama.cpp's server (llama-cpp-python)
with the key file `serve` takes: per-tenant token counters through a real
Prometheus equal the sum of `usage` over each tenant's responses; a tenant over
its concurrency limit gets 429 with Retry-After while another gets 200; an
unknown key gets 401; the keys appear neither in /metrics nor in the log; and
with `--max-upstream-concurrency 1` a light tenant is admitted ahead of a
flooding tenant's queue.

Every proxy here runs with `--max-upstream-concurrency 1`: llama-cpp-python's
server interrupts a running request when another arrives, so two requests must
never reach it at once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import openai
import pytest
import requests

from test_proxy import Proxy, total

KEYS = {"team-a": "sk-tenant-a-0123", "team-b": "sk-tenant-b-4567", "team-c": "sk-tenant-c-89ab"}


def client(proxy, key):
    return openai.OpenAI(base_url=proxy.base + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture
def key_file(workdir):
    path = workdir / "proxy-tenant-keys.json"
    path.write_text(json.dumps({"tenants": [
        {"name": "team-a", "key": KEYS["team-a"], "weight": 1},
        {"name": "team-b", "key": KEYS["team-b"], "max_concurrent": 1},
        {"name": "team-c", "key": KEYS["team-c"], "max_waiting": 16},
    ]}))
    return path


def test_proxy_tenants_attribution_limits_and_keys(llama_cpp_server, key_file, make_prometheus, workdir):
    up = llama_cpp_server
    p = Proxy(up.base_url, workdir, ["--api-key-file", str(key_file), "--max-upstream-concurrency", "1"])
    try:
        prom = make_prometheus([f"127.0.0.1:{p.port}"])
        prom.wait_scrape_after(time.time())

        # Unknown key and no key: 401 with an OpenAI error body.
        with pytest.raises(openai.AuthenticationError):
            client(p, "sk-not-a-tenant").completions.create(model=up.model, prompt="hi", max_tokens=2)
        r = requests.post(p.base + "/v1/completions", json={"model": up.model, "prompt": "hi"}, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["type"] == "invalid_request_error", r.text

        # A mixed run of three tenants: each tenant's counters are its usage.
        want = defaultdict(lambda: [0, 0, 0])
        for i in range(12):
            tenant = ["team-a", "team-b", "team-c"][i % 3]
            r = client(p, KEYS[tenant]).completions.create(
                model=up.model, prompt=f"tenant request {i} " * (1 + i % 4), max_tokens=3 + i % 5)
            want[tenant][0] += r.usage.prompt_tokens
            want[tenant][1] += r.usage.completion_tokens
            want[tenant][2] += 1
        t = prom.wait_scrape_after(time.time() + 1.0)
        text = p.metrics_text()
        ns = "inferscope:" if "inferscope:" in text else "inferscope_"

        def by_tenant(expr):
            return {s["metric"]["tenant"]: float(s["value"][1]) for s in prom.query(f"sum by (tenant) ({expr})", t)}

        prompt = by_tenant(f"{ns}prompt_tokens_total")
        generation = by_tenant(f"{ns}generation_tokens_total")
        finished = by_tenant(f"{ns}request_success_total")
        e2e = by_tenant(f"{ns}e2e_request_latency_seconds_count")
        for tenant, (pt, gt, n) in want.items():
            assert prompt.get(tenant) == pt, (tenant, prompt, dict(want))
            assert generation.get(tenant) == gt, (tenant, generation, dict(want))
            assert finished.get(tenant) == n, (tenant, finished)
            assert e2e.get(tenant) == n, (tenant, e2e)

        # team-b may have one request in flight: its second gets 429 with
        # Retry-After, naming the limit, while team-a gets 200.
        done = threading.Event()

        def long_b():
            try:
                for _ in client(p, KEYS["team-b"]).completions.create(
                        model=up.model, prompt="a long one", max_tokens=200, stream=True):
                    pass
            finally:
                done.set()

        th = threading.Thread(target=long_b)
        th.start()
        deadline = time.monotonic() + 30
        while total(p.metrics_text(), f"{ns}num_requests_running") < 1:
            assert time.monotonic() < deadline, "team-b's stream never started"
            time.sleep(0.02)
        r = requests.post(p.base + "/v1/completions", timeout=60,
                          headers={"Authorization": f"Bearer {KEYS['team-b']}"},
                          json={"model": up.model, "prompt": "second", "max_tokens": 2})
        assert not done.is_set(), "the long stream ended before the second request: make it longer"
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        assert "team-b" in r.json()["error"]["message"] and "max_concurrent" in r.json()["error"]["message"]
        ok = client(p, KEYS["team-a"]).completions.create(model=up.model, prompt="meanwhile", max_tokens=2)
        assert ok.usage.completion_tokens > 0
        th.join(120)
        # The hold was released with the stream.
        client(p, KEYS["team-b"]).completions.create(model=up.model, prompt="again", max_tokens=2)
        text = p.metrics_text()
        assert total(text, f"{ns}admission_rejections_total", reason="tenant_limit") == 1

        # The keys reach neither the metrics nor the log.
        log = p.log.read_text(errors="replace")
        for key in KEYS.values():
            assert key not in text and key not in log
    finally:
        p.stop()


def test_proxy_admits_a_light_tenant_ahead_of_a_flood(llama_cpp_server, key_file, workdir):
    up = llama_cpp_server
    p = Proxy(up.base_url, workdir, ["--api-key-file", str(key_file), "--max-upstream-concurrency", "1"])
    try:
        ns = "inferscope:" if "inferscope:" in p.metrics_text() else "inferscope_"
        flood: list[tuple[float, float]] = []
        lock = threading.Lock()

        def stream(key, out):
            """(sent, ended) in monotonic seconds. With one request upstream
            at a time, the order of the ends is the order of admission."""
            # The client is built before the clock starts: building one takes
            # milliseconds, which counted as "sent" let a flood request
            # admitted meanwhile look as if it had gone ahead of the light one.
            c = client(p, key)
            start = time.monotonic()
            # No end-of-sequence token (id 2 in tiny_gguf.py): every request
            # runs its 64 tokens, so each holds the upstream equally long.
            for _ in c.completions.create(model=up.model, prompt="flood of tokens",
                                          max_tokens=64, stream=True, temperature=0,
                                          logit_bias={"2": -100}):
                pass
            with lock:
                out.append((start, time.monotonic()))

        # llama.cpp's first request is slow (warm-up): not part of the figures.
        client(p, KEYS["team-b"]).completions.create(model=up.model, prompt="warm up", max_tokens=4)
        # Tenant team-c floods with 8 streams; team-a asks once most wait.
        threads = [threading.Thread(target=stream, args=(KEYS["team-c"], flood)) for _ in range(8)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 60
        while total(p.metrics_text(), f"{ns}num_requests_running") < 6:
            assert time.monotonic() < deadline, "the flood never queued up"
            time.sleep(0.005)
        light: list[tuple[float, float]] = []
        stream(KEYS["team-a"], light)
        for th in threads:
            th.join(300)
        assert len(flood) == 8
        (sent, ended), = light
        # The flood's requests in flight or waiting when the light one was
        # sent, and those of them that ended before it. The light request
        # reaches the proxy's queue a few milliseconds after `sent`: a flood
        # request that ended within `MARGIN` of it may have ended before the
        # light one was queued, so it is not counted as having gone ahead.
        # MARGIN is well under the time one flood request holds the upstream
        # (checked), so no request that was admitted ahead escapes the count.
        MARGIN = 0.015
        ends = sorted(e for _, e in flood)
        hold = min(b - a for a, b in zip(ends, ends[1:]))
        assert hold > 2 * MARGIN, f"flood requests end {hold:.3f} s apart: make them longer"
        waiting = [e for s, e in flood if s < sent and e > sent]
        ahead = [e for e in waiting if sent + MARGIN < e < ended]
        took, queue = ended - sent, max(waiting) - sent
        print(f"light request: {took:.3f} s; {len(waiting)} flood requests in flight or waiting, "
              f"{len(ahead)} ended first; the last of them {queue:.3f} s after the light one was sent; "
              f"flood requests at least {hold:.3f} s apart")
        assert len(waiting) >= 4, "the flood was not queued when the light tenant asked"
        # Behind the one in flight and at most one more flood request (its
        # turn), not behind the whole queue, and done well before the queue.
        assert len(ahead) <= 2, (took, waiting)
        assert took < 0.6 * queue, (took, queue)
    finally:
        p.stop()
