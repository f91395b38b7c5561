"""Exemplars, per-request timings and the request log, checked with real
components: the official openai client (`extra_body`), Python
prometheus_client's OpenMetrics parser, and Prometheus with exemplar storage
returning exemplars from /api/v1/query_exemplars."""

import json
import time

import openai
import pytest
import requests
from prometheus_client.openmetrics.parser import text_string_to_metric_families

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
# Latency histogram → the response `metrics` key holding the same figure (ms).
SAME_FIGURE = {
    "inferscope_e2e_request_latency_seconds": "generation_time_ms",
    "inferscope_time_to_first_token_seconds": "time_to_first_token_ms",
    "inferscope_request_queue_time_seconds": "queue_time_ms",
    "inferscope_request_prefill_time_seconds": "prefill_time_ms",
    "inferscope_request_decode_time_seconds": "decode_time_ms",
}


def _send(server, n: int, prefix: str):
    """`n` completions with `x-request-id` and `include_metrics`; returns
    {client id: (metrics, trace id from a `traceparent` response header or None)}."""
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=60)
    sent = {}
    for i in range(n):
        rid = f"{prefix}-{i}"
        raw = client.completions.with_raw_response.create(
            model="sim-llama", prompt=f"exemplar request {i}", max_tokens=4 + i % 5,
            extra_body={"ignore_eos": True, "include_metrics": True},
            extra_headers={"x-request-id": rid})
        resp = raw.parse()
        metrics = (resp.model_extra or {}).get("metrics")
        assert metrics, f"no metrics in {resp}"
        assert resp.usage.completion_tokens == 4 + i % 5
        tp = raw.headers.get("traceparent")
        trace = tp.split("-")[1] if tp else None
        sent[rid] = (metrics, trace)
    return sent


def _owner(labels: dict, sent: dict):
    """The client id an exemplar names (trace id when the server traces, else
    the engine request id `<client id>-<n>`), or None."""
    if "trace_id" in labels:
        return next((rid for rid, (_, t) in sent.items() if t == labels["trace_id"]), None)
    rid = labels.get("request_id", "")
    return next((c for c in sent if rid.startswith(c + "-")), None)


@pytest.fixture
def timed_server(make_server, workdir):
    log = workdir / f"requests-{time.monotonic_ns()}.jsonl"
    s = make_server(["--sim-profile", "tiny", "--enable-per-request-metrics", "--enable-request-log", str(log)])
    s.request_log = log
    return s


def test_openmetrics_exemplars_parse_and_name_the_requests(timed_server):
    sent = _send(timed_server, 6, "om")
    r = requests.get(timed_server.base + "/metrics", headers={"Accept": OPENMETRICS}, timeout=10)
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    seen = 0
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.exemplar is None:
                continue
            seen += 1
            assert s.name.endswith("_bucket") or s.name.endswith("_total"), s
            owner = _owner(s.exemplar.labels, sent)
            assert owner is not None, f"exemplar of an unknown request: {s}"
            assert s.exemplar.timestamp is not None and abs(float(s.exemplar.timestamp) - time.time()) < 120
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                assert s.exemplar.value <= le, s
            key = SAME_FIGURE.get(family.name)
            if key is not None:
                # The exemplar's value is the figure that request got back.
                ms = sent[owner][0][key]
                assert s.exemplar.value == pytest.approx(ms / 1e3, rel=1e-9, abs=1e-12), (s, ms)
    assert seen >= 6, r.text
    # Prometheus text 0.0.4 never carries them.
    plain = requests.get(timed_server.base + "/metrics", timeout=10).text
    assert " # {" not in plain


def test_prometheus_stores_and_returns_the_exemplars(timed_server, make_prometheus):
    prom = make_prometheus([f"127.0.0.1:{timed_server.port}"], extra_args=("--enable-feature=exemplar-storage",))
    start = time.time()
    prom.wait_scrape_after(start - 5)
    sent = _send(timed_server, 8, "prom")
    prom.wait_scrape_after(time.time())
    query = '{__name__=~"inferscope_(e2e_request_latency_seconds|time_to_first_token_seconds|request_queue_time_seconds)_bucket"}'
    deadline = time.monotonic() + 30
    while True:
        r = requests.get(prom.base + "/api/v1/query_exemplars",
                         params={"query": query, "start": f"{start - 60:.3f}", "end": f"{time.time() + 60:.3f}"},
                         timeout=10)
        body = r.json()
        assert body["status"] == "success", body
        found = [(series["seriesLabels"], ex) for series in body["data"] for ex in series["exemplars"]]
        names = {s["__name__"] for s, _ in found}
        if len(names) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(names) == 3, body
    owners = set()
    for series, ex in found:
        owner = _owner(ex["labels"], sent)
        assert owner is not None, f"exemplar of an unknown request: {ex}"
        owners.add(owner)
        ms = sent[owner][0][SAME_FIGURE[series["__name__"].removesuffix("_bucket")]]
        assert float(ex["value"]) == pytest.approx(ms / 1e3, rel=1e-9, abs=1e-12), (series, ex, ms)
        assert start - 5 <= float(ex["timestamp"]) <= time.time() + 5
    assert owners, found


def test_request_log_has_one_line_per_request_matching_usage(timed_server):
    sent = _send(timed_server, 5, "log")
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(l) for l in timed_server.request_log.read_text().splitlines()] \
            if timed_server.request_log.exists() else []
        if len(lines) >= len(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    ours = [l for l in lines if _owner({"request_id": l["request_id"]}, sent)]
    assert len(ours) == len(sent), lines
    for l in ours:
        owner = _owner({"request_id": l["request_id"]}, sent)
        metrics, trace = sent[owner]
        i = int(owner.rsplit("-", 1)[1])
        assert l["completion_tokens"] == 4 + i % 5
        assert l["finish_reason"] == "length"
        assert l["trace_id"] == trace
        for key in ("generation_time_ms", "time_to_first_token_ms", "queue_time_ms", "num_preemptions"):
            assert l[key] == pytest.approx(metrics[key]), key
