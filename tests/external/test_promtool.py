"""promtool on a live /metrics after traffic, and on the shipped deploy/ files."""

from __future__ import annotations

import json
import re

import openai
import pytest
import requests

from conftest import MODEL, REPO, run_promtool

# The only `promtool check metrics` findings `--metrics-namespace vllm` may
# cause: vLLM's own names, which dashboards, autoscalers and the Gateway API
# Inference Extension read, so that namespace must reproduce them exactly.
# Each entry: metric name pattern, message, why it stays. The default
# namespace (`inferscope_*`, `inferscope_iteration_tokens`) has none.
VLLM_LINT = [
    (r"vllm:.+", "metric names should not contain ':'",
     "vLLM's engine metrics are namespaced with a colon (`vllm:num_requests_waiting`)"),
    (r"vllm:iteration_tokens_total", "non-counter metrics should not have \"_total\" suffix",
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


def _vllm_caused(metric: str, message: str) -> str | None:
    """Why a finding is vLLM's naming, or None when it is not."""
    for pattern, expected, why in VLLM_LINT:
        if re.fullmatch(pattern, metric) and message == expected:
            return why
    return None


def _live_metrics(server) -> str:
    """/metrics after successful, streaming, failed and unmatched requests."""
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0)
    c.completions.create(model=MODEL, prompt="hello", max_tokens=8, extra_body={"ignore_eos": True})
    list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                   stream=True, stream_options={"include_usage": True}))
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    requests.get(server.base + "/no/such/path", timeout=5)
    text = server.metrics_text()
    assert 'http_requests_total{' in text
    return text


def _check(body: str, label: str) -> tuple[int, list[tuple[str, str]]]:
    # promtool checks the Prometheus text format 0.0.4 (what /metrics serves by
    # default). The OpenMetrics variant is what the real Prometheus negotiates
    # in test_prometheus_agreement.py, where its scrapes must succeed.
    r = run_promtool("check", "metrics", stdin=body)
    findings = _lint_findings(r.stdout + r.stderr)
    print(f"\npromtool check metrics ({label}, text 0.0.4): exit {r.returncode}, {len(findings)} finding(s)")
    for metric, message in findings:
        print(f"  {metric} {message}" + ("   [vLLM's naming]" if _vllm_caused(metric, message) else ""))
    # Exit 1 = the exposition did not parse; 3 = lint findings only.
    assert r.returncode in (0, 3), r.stdout + r.stderr
    assert (r.returncode == 3) == bool(findings), r.stdout + r.stderr
    return r.returncode, findings


def test_promtool_check_metrics_default_namespace_is_clean(sim_server):
    body = _live_metrics(sim_server)
    assert "inferscope_request_success_total" in body
    assert "inferscope_iteration_tokens_bucket{" in body
    code, findings = _check(body, "default namespace")
    assert findings == [], findings
    assert code == 0


def test_promtool_check_metrics_vllm_namespace_only_vllm_names(make_server):
    server = make_server(["--metrics-namespace", "vllm"])
    body = _live_metrics(server)
    assert "vllm:request_success_total" in body
    code, findings = _check(body, "--metrics-namespace vllm")
    other = [(m, msg) for m, msg in findings if not _vllm_caused(m, msg)]
    assert not other, f"findings not caused by vLLM's names: {other}"
    # And each expected kind is there: the colon on every engine family, the
    # `_total` on the histogram.
    families = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE vllm:")}
    colon = {m for m, msg in findings if msg == VLLM_LINT[0][1]}
    assert colon == families, sorted(colon ^ families)
    assert ("vllm:iteration_tokens_total", VLLM_LINT[1][1]) in findings
    assert code == 3


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
    assert {"datasource", "prefix", "model_name", "engine"} <= set(variables)
    assert variables["prefix"]["current"]["value"] == "inferscope_"
    assert [o["value"] for o in variables["prefix"]["options"]] == ["inferscope_", "vllm:"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dash["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        for t in p.get("targets", []):
            expr = t["expr"]
            for literal in ("inferscope_", "inferscope:", "vllm:"):
                assert literal not in expr, f"{p['title']}: literal {literal} instead of ${{prefix}}: {expr}"
            if "http_" not in expr:
                assert "${prefix}" in expr, f"{p['title']}: {expr}"
                assert 'model_name=~"$model_name"' in expr, f"{p['title']}: {expr}"
    # The generator and the committed JSON agree.
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", REPO / "deploy/grafana/generate_dashboard.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.build() == dash, "run deploy/grafana/generate_dashboard.py and commit the JSON"
