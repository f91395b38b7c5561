"""promtool on a live /metrics after traffic, and on the shipped deploy/ files."""

from __future__ import annotations

import json
import re

import openai
import pytest
import requests

from conftest import MODEL, REPO, run_promtool

# `promtool check metrics` lint findings that are inherent to the vLLM metric
# names inferscope keeps on purpose (dashboards, autoscalers and the Gateway
# API Inference Extension read these exact names). Each entry: metric name
# pattern (namespace stripped), message fragment, and why it stays.
ALLOWED_LINT = [
    (r".+", "metric names should not contain ':'",
     "vLLM's engine metrics are namespaced with a colon (`vllm:num_requests_waiting`); "
     "routers and dashboards query those exact names, and `--metrics-namespace vllm` must "
     "reproduce them, so the `inferscope:` namespace keeps the same shape"),
    (r"iteration_tokens_total", "non-counter metrics should not have \"_total\" suffix",
     "vLLM's histogram of tokens per engine step is named `vllm:iteration_tokens_total`"),
]


def _lint_findings(output: str) -> list[tuple[str, str]]:
    """(metric, message) pairs from promtool's `name message` lines."""
    out = []
    for line in output.splitlines():
        line = line.strip()
        if not line:
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$", line)
        if m:
            out.append((m.group(1), m.group(2)))
        else:
            out.append(("", line))
    return out


def _allowed(metric: str, message: str) -> str | None:
    if not metric.startswith("inferscope:"):
        return None  # HTTP metrics carry no namespace: no finding is inherent to them
    short = metric.split(":", 1)[1]
    for pattern, fragment, why in ALLOWED_LINT:
        if re.fullmatch(pattern, short) and fragment in message:
            return why
    return None


@pytest.fixture(scope="module")
def live_metrics(sim_server):
    """/metrics after successful, streaming, failed and unmatched requests."""
    c = openai.OpenAI(base_url=sim_server.base + "/v1", api_key="x", max_retries=0)
    c.completions.create(model=MODEL, prompt="hello", max_tokens=8, extra_body={"ignore_eos": True})
    list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                   stream=True, stream_options={"include_usage": True}))
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    requests.get(sim_server.base + "/no/such/path", timeout=5)
    text = sim_server.metrics_text()
    assert "inferscope:request_success_total" in text
    assert 'http_requests_total{' in text
    return text


def test_promtool_check_metrics_on_live_server(live_metrics):
    # promtool checks the Prometheus text format 0.0.4 (what /metrics serves by
    # default). The OpenMetrics variant is what the real Prometheus negotiates
    # in test_prometheus_agreement.py, where its scrapes must succeed.
    body = live_metrics
    r = run_promtool("check", "metrics", stdin=body)
    findings = _lint_findings(r.stdout + r.stderr)
    print(f"\npromtool check metrics (live /metrics, text 0.0.4): exit {r.returncode}, {len(findings)} finding(s)")
    unexplained = []
    for metric, message in findings:
        why = _allowed(metric, message)
        print(f"  {metric} {message}" + ("   [allowed: vLLM naming]" if why else "   [NOT ALLOWED]"))
        if not why:
            unexplained.append((metric, message))
    # Exit 1 = the exposition did not parse; 3 = lint findings only.
    assert r.returncode in (0, 3), r.stdout + r.stderr
    assert not unexplained, unexplained
    if r.returncode == 3:
        assert findings


def test_promtool_check_rules():
    r = run_promtool("check", "rules", str(REPO / "deploy/prometheus/alerts.yml"))
    print("\n" + r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_test_rules():
    r = run_promtool("test", "rules", str(REPO / "deploy/prometheus/alerts_test.yml"))
    print("\n" + r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_check_config():
    r = run_promtool("check", "config", str(REPO / "deploy/prometheus/prometheus.yml"))
    print("\n" + r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dashboard_is_importable_json():
    dash = json.loads((REPO / "deploy/grafana/inferscope-dashboard.json").read_text())
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "model_name", "engine"} <= set(variables)
    assert variables["namespace"]["current"]["value"] == "inferscope"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        for t in p.get("targets", []):
            expr = t["expr"]
            names = re.findall(r"[a-zA-Z_$][a-zA-Z0-9_:{}$]*:[a-zA-Z_][a-zA-Z0-9_]*", expr)
            for n in names:
                assert n.startswith("${namespace}:"), f"{p['title']}: {n} does not use ${{namespace}}"
            if "http_" not in expr:
                assert "${namespace}:" in expr, f"{p['title']}: {expr}"
                assert 'model_name=~"$model_name"' in expr, f"{p['title']}: {expr}"
    # The generator and the committed JSON agree.
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", REPO / "deploy/grafana/generate_dashboard.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.build() == dash, "run deploy/grafana/generate_dashboard.py and commit the JSON"
