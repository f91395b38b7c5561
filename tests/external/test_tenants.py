"""Per-tenant attribution seen through a real Prometheus: for a mixed run of
tenants, each tenant's prompt and generation token counters equal the sum
of `usage` over that tenant's responses, with more tenants than
`--max-tenant-labels` so that the `other` fold is exercised."""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
from collections import defaultdict

import requests

from conftest import MODEL

# (key, tenant, its label under a bound of 3: anonymous, team-a, team-b)
TENANTS = [
    ("key-a", "team-a", "team-a"),
    ("key-b", "team-b", "team-b"),
    ("key-c", "team-c", "other"),
    ("key-d", "team-d", "other"),
]


def test_tenant_token_counters_equal_their_usage_through_prometheus(make_server, make_prometheus, workdir):
    keys = workdir / "tenant-keys.json"
    keys.write_text(json.dumps({"tenants": [{"name": t, "key": k} for k, t, _ in TENANTS]}))
    server = make_server(["--sim-profile", "tiny", "--metrics-namespace", "vllm",
                          "--api-key-file", str(keys), "--max-tenant-labels", "3"])
    prom = make_prometheus([f"127.0.0.1:{server.port}"])
    prom.wait_scrape_after(time.time())

    def one(i):
        key, _, label = TENANTS[i % len(TENANTS)]
        r = requests.post(server.base + "/v1/completions", timeout=60,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": MODEL, "prompt": f"tenant request {i} " * (1 + i % 5),
                                "max_tokens": 4 + i % 13, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return label, r.json()["usage"]

    want = defaultdict(lambda: [0, 0, 0])
    with cf.ThreadPoolExecutor(8) as pool:
        for label, usage in pool.map(one, range(60)):
            want[label][0] += usage["prompt_tokens"]
            want[label][1] += usage["completion_tokens"]
            want[label][2] += 1
    t = prom.wait_scrape_after(time.time() + 1.0)

    def by_tenant(expr):
        return {s["metric"]["tenant"]: float(s["value"][1]) for s in prom.query(f"sum by (tenant) ({expr})", t)}

    prompt = by_tenant("vllm:prompt_tokens_total")
    generation = by_tenant("vllm:generation_tokens_total")
    finished = by_tenant('vllm:request_success_total{finished_reason="length"}')
    for label, (p, g, n) in want.items():
        assert prompt.get(label) == p, (label, prompt, dict(want))
        assert generation.get(label) == g, (label, generation, dict(want))
        assert finished.get(label) == n, (label, finished)
    # Only the bounded values exist: the folded tenants have no series.
    assert set(prompt) == {"anonymous", "team-a", "team-b", "other"}, prompt
    assert prompt["anonymous"] == 0
    assert prom.scalar("vllm:tenant_labels_folded", t) == 2
    # The keys never reach the metrics.
    assert "key-" not in server.metrics_text()
