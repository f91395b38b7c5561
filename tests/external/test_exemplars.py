"""Exemplars, per-request timings and the request log, checked with real
components: the official openai client (`extra_body`), Python
prometheus_client's OpenMetrics parser, and Prometheus with exemplar storage
returning exemplars from /api/v1/query_exemplars."""

import json
import re
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


def test_n2_metrics_cover_every_choice(timed_server):
    """n=2: `metrics` is the request's, over both choices (the request log
    has each choice's line): the earlier first token, the later end, every
    token, every inter-token gap; the TGI headers agree."""
    rid = f"n2-{time.monotonic_ns()}"
    r = requests.post(timed_server.base + "/v1/completions", timeout=60,
                      headers={"x-request-id": rid},
                      json={"model": "sim-llama", "prompt": "two choices", "n": 2, "max_tokens": 7,
                            "ignore_eos": True, "include_metrics": True})
    assert r.status_code == 200, r.text
    body = r.json()
    m = body["metrics"]
    assert body["usage"]["completion_tokens"] == 14
    deadline = time.monotonic() + 10
    while True:
        lines = [json.loads(l) for l in timed_server.request_log.read_text().splitlines()] \
            if timed_server.request_log.exists() else []
        ours = [l for l in lines if l["request_id"].startswith(rid + "-")]
        if len(ours) >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(ours) == 2, lines
    assert sum(l["completion_tokens"] for l in ours) == body["usage"]["completion_tokens"]
    approx = lambda v: pytest.approx(v, rel=1e-9, abs=1e-9)  # noqa: E731
    assert m["time_to_first_token_ms"] == approx(min(l["time_to_first_token_ms"] for l in ours))
    assert m["generation_time_ms"] == approx(max(l["generation_time_ms"] for l in ours))
    assert m["queue_time_ms"] == approx(min(l["queue_time_ms"] for l in ours))
    assert m["num_preemptions"] == sum(l["num_preemptions"] for l in ours)
    assert m["tokens_per_second"] == approx(14 / (m["generation_time_ms"] / 1e3))
    gaps = sum(l["completion_tokens"] - 1 for l in ours)
    assert m["mean_itl_ms"] == approx(sum(l["mean_itl_ms"] * (l["completion_tokens"] - 1) for l in ours) / gaps)
    first_token = min(l["queue_time_ms"] + l["prefill_time_ms"] for l in ours)
    last_token = max(l["queue_time_ms"] + l["prefill_time_ms"] + l["decode_time_ms"] for l in ours)
    assert m["prefill_time_ms"] == pytest.approx(first_token - m["queue_time_ms"], abs=1e-6)
    assert m["decode_time_ms"] == pytest.approx(last_token - first_token, abs=1e-6)
    assert int(r.headers["x-total-time"]) == round(m["generation_time_ms"])
    assert int(r.headers["x-queue-time"]) == round(m["queue_time_ms"])


def test_dashboard_latency_panels_show_exemplars(timed_server):
    """Grafana itself cannot be installed here (no package ships it), so this
    checks what it would read: every dashboard panel that plots a histogram
    the server attaches exemplars to asks Prometheus for them, on a
    Prometheus data source; and docs/tracing.md provisions that data source
    with a `trace_id` exemplar link to a tracing data source."""
    import yaml
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    _send(timed_server, 3, "dash")
    text = requests.get(timed_server.base + "/metrics", headers={"Accept": OPENMETRICS}, timeout=10).text
    with_exemplars = {f.name for f in text_string_to_metric_families(text)
                      if f.type == "histogram" and any(s.exemplar for s in f.samples)}
    assert "inferscope_time_to_first_token_seconds" in with_exemplars, with_exemplars

    dash = json.loads((repo / "deploy/grafana/inferscope-dashboard.json").read_text())

    def panels(ps):
        for p in ps:
            yield p
            yield from panels(p.get("panels", []))

    checked = set()
    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            expr = t.get("expr", "").replace("${prefix}", "inferscope_")
            if t.get("exemplar") is True:
                # Dots asked of a histogram that never carries any promise what cannot come.
                asked = set(re.findall(r"(inferscope_\w+)_bucket", expr))
                assert asked and asked <= with_exemplars, f"panel {p['title']!r} asks exemplars of {asked}"
            plotted = {h for h in with_exemplars if h + "_bucket" in expr}
            if not plotted:
                continue
            checked |= plotted
            assert p["datasource"]["type"] == "prometheus", p["title"]
            # One query per histogram of the panel is enough for the dots.
            asks = [u for u in p["targets"] if u.get("exemplar") is True
                    and any(h + "_bucket" in u["expr"].replace("${prefix}", "inferscope_") for h in plotted)]
            assert asks, f"panel {p['title']!r} plots {plotted} without exemplars"
    # The four latency panels of the dashboard.
    assert {"inferscope_time_to_first_token_seconds", "inferscope_inter_token_latency_seconds",
            "inferscope_e2e_request_latency_seconds", "inferscope_request_queue_time_seconds"} <= checked, checked

    doc = (repo / "docs/tracing.md").read_text()
    blocks = [yaml.safe_load(b.split("\n", 1)[1]) for b in doc.split("```")[1::2] if b.startswith("yaml")]
    sources = [d for b in blocks if isinstance(b, dict) for d in b.get("datasources", [])]
    prom = [d for d in sources if d.get("type") == "prometheus"]
    assert prom, "docs/tracing.md provisions no Prometheus data source"
    dests = prom[0]["jsonData"]["exemplarTraceIdDestinations"]
    tracing = {d["uid"] for d in sources if d.get("type") in ("tempo", "jaeger")}
    assert any(d["name"] == "trace_id" and d["datasourceUid"] in tracing for d in dests), dests
