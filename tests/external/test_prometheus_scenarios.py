"""Scenarios seen through a real Prometheus: `--metrics-namespace vllm` (the
shipped dashboard, with its `prefix` variable set to `vllm:`, works
unchanged, and the series routers read are there under vLLM's names); client
aborts and invalid requests."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time

import requests

from conftest import MODEL, REPO


def test_dashboard_with_vllm_namespace(make_server, make_prometheus):
    # The flagged series (KV residency, MFU) on too: every panel must have data.
    server = make_server(["--sim-profile", "tiny", "--data-parallel-size", "2", "--metrics-namespace", "vllm",
                          "--kv-cache-metrics", "--enable-mfu-metrics"])
    prom = make_prometheus([f"127.0.0.1:{server.port}"])
    prom.wait_scrape_after(time.time())

    def one(i):
        r = requests.post(server.base + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": f"request {i}", "max_tokens": 16, "ignore_eos": True})
        assert r.status_code == 200, r.text

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(40)))
    t = prom.wait_scrape_after(time.time() + 1.0)

    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:cache_config_info"):
        res = prom.query(name, t)
        assert sorted(s["metric"]["engine"] for s in res) == ["0", "1"], (name, res)
    cfg = prom.query("vllm:cache_config_info", t)[0]["metric"]
    assert int(cfg["block_size"]) > 0 and int(cfg["num_gpu_blocks"]) > 0
    assert prom.query('{__name__=~"inferscope[_:].+"}', t) == []
    assert prom.scalar('sum(vllm:request_success_total{finished_reason="length"})', t) == 40

    dash = json.loads((REPO / "deploy/grafana/inferscope-dashboard.json").read_text())
    subst = {"${prefix}": "vllm:", "$model_name": MODEL, "$engine": "0|1", "$__rate_interval": "1m", "$peak_flops": "989e12"}
    empty = []
    for p in dash["panels"]:
        for target in p.get("targets", []):
            expr = target["expr"]
            for k, v in subst.items():
                expr = expr.replace(k, v)
            if not prom.query(expr, t) and "admission" not in expr and "preemptions" not in expr:
                empty.append((p["title"], expr))
    assert not empty, empty
    # The variables' own queries resolve too.
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"].replace("${prefix}", "vllm:").replace("$model_name", MODEL)
            metric = q[len("label_values("):q.rindex(",")]
            label = q[q.rindex(",") + 1:-1].strip()
            values = {s["metric"].get(label) for s in prom.query(metric, t)}
            assert values and None not in values, (v["name"], q, values)


def test_aborts_and_errors_as_prometheus_sees_them(make_server, make_prometheus):
    """A client that disconnects mid-stream is counted once as `abort`, its
    blocks are freed; invalid requests are 4xx in the HTTP metrics and never
    reach the engine."""
    server = make_server(["--sim-profile", "tiny,t_fixed_ms=20"])
    prom = make_prometheus([f"127.0.0.1:{server.port}"])
    prom.wait_scrape_after(time.time())

    with requests.post(server.base + "/v1/completions", stream=True, timeout=60, json={
            "model": MODEL, "prompt": "abort me", "max_tokens": 500, "ignore_eos": True, "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                break  # first token seen: hang up
    for body in ({"model": MODEL, "prompt": "x", "max_tokens": -1},
                 {"model": MODEL, "prompt": "x", "temperature": -2},
                 {"model": "nope", "prompt": "x"}):
        assert requests.post(server.base + "/v1/completions", json=body, timeout=10).status_code in (400, 404)

    deadline = time.time() + 20
    while True:
        t = prom.wait_scrape_after(time.time())
        aborted = prom.scalar('sum(inferscope_request_success_total{finished_reason="abort"})', t)
        if aborted >= 1 or time.time() > deadline:
            break
    print(f"\nabort test: request_success{{abort}}={aborted}")
    assert aborted == 1
    assert prom.scalar('sum(inferscope_request_success_total{finished_reason!="abort"})', t) == 0
    assert prom.scalar("sum(inferscope_num_requests_running) + sum(inferscope_num_requests_waiting)", t) == 0
    assert prom.scalar("max(inferscope_kv_cache_usage_perc)", t) == 0
    assert prom.scalar('sum(http_requests_total{handler="/v1/completions",status="4xx"})', t) == 3
    assert prom.scalar('sum(http_requests_total{handler="/v1/completions",status="2xx"})', t) == 1
    # The aborted request produced some tokens, far fewer than asked.
    assert 1 <= prom.scalar("sum(inferscope_generation_tokens_total)", t) < 500
