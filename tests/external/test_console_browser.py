"""The console (`GET /`, docs/console.md) in a real browser: selenium drives
Debian's chromium (chromedriver from the `chromium-driver` package).

A sim server with two engines is held at a steady load (each engine runs 2
requests and queues 1); the page must show each engine's running and waiting
counts as `/metrics` has them, its KV usage within what `/metrics` read just
before and after, drawn throughput lines whose hover text agrees with the
generation rate `/metrics` gives, the four latency panels, a request
sent with a known `x-request-id` in the recent-requests table, no script
error, and no horizontal overflow at phone width.
"""

from __future__ import annotations

import re
import shutil
import threading
import time

import openai
import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from conftest import Server

CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
NS = "inferscope_"


def gauge(text: str, name: str, engine: str) -> float:
    """The value of `NS name{…engine="E"…}` in an exposition."""
    for line in text.splitlines():
        if line.startswith(NS + name + "{") and f'engine="{engine}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} of engine {engine} not in /metrics")


def counter(text: str, name: str) -> float:
    """`NS name` summed over its label sets (every engine)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(NS + name + "{"))


def steady(server: Server) -> str:
    deadline = time.time() + 20
    while True:
        text = server.metrics_text()
        if all(gauge(text, "num_requests_running", e) == 2 and gauge(text, "num_requests_waiting", e) == 1
               for e in ("0", "1")):
            return text
        assert time.time() < deadline, "the load never settled"
        time.sleep(0.05)


@pytest.fixture
def browser():
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_window_size(1280, 800)
    yield driver
    driver.quit()


def recent_row(browser, prefix: str):
    """The cells of the recent-requests row whose id starts with `prefix`,
    read in one script (the table is redrawn every second)."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#recent tbody tr')]"
        ".map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent));")
    return next((r for r in rows if r[1].startswith(prefix)), None)


def wait_for(what: str, check, timeout: float = 20):
    deadline = time.time() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_console_shows_what_metrics_says(make_server, browser):
    server = make_server(["--sim-profile", "tiny,t_weights_ms=20", "--data-parallel-size", "2",
                          "--max-num-seqs", "2"])
    probe = requests.post(server.base + "/v1/completions", headers={"x-request-id": "browser-probe"},
                          json={"model": "sim-llama", "prompt": "hi", "max_tokens": 5}, timeout=30)
    assert probe.status_code == 200, probe.text
    def long_request():
        try:
            requests.post(server.base + "/v1/completions",
                          json={"model": "sim-llama", "prompt": "load", "max_tokens": 4000,
                                "min_tokens": 4000, "ignore_eos": True}, timeout=120)
        except requests.RequestException:
            pass  # the server stops first

    load = [threading.Thread(target=long_request, daemon=True) for _ in range(6)]
    for t in load:
        t.start()
    try:
        steady(server)
        browser.get(server.base + "/")
        wait_for("live samples", lambda: browser.find_element(By.ID, "status").text.startswith("live,"))
        # The page redraws each second: wait for a sample taken after `before`.
        before = server.metrics_text()
        time.sleep(2.5)
        # Read in one script: the cards are redrawn every second.
        shown = browser.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#engines .card')].map(c => [c.dataset.engine,"
            " Object.fromEntries(['running', 'waiting', 'kv'].map(k => [k, c.querySelector('dd.' + k).textContent]))]));")
        after = steady(server)
        assert sorted(shown) == ["0", "1"], shown
        for e, v in shown.items():
            assert int(v["running"]) == gauge(after, "num_requests_running", e) == 2, (e, v)
            assert int(v["waiting"]) == gauge(after, "num_requests_waiting", e) == 1, (e, v)
            kv = float(v["kv"].rstrip(" %")) / 100
            lo, hi = gauge(before, "kv_cache_usage_perc", e), gauge(after, "kv_cache_usage_perc", e)
            # Shown to 0.1 %: half of that either side.
            assert lo - 0.0005 <= kv <= hi + 0.0005, (e, kv, lo, hi)
            assert hi > 0, "the load holds KV blocks"

        lines = browser.execute_script(
            "return [...document.querySelectorAll('#tokens-chart polyline')]"
            ".map(p => p.points.numberOfItems);")
        assert len(lines) == 2 and min(lines) > 1, lines
        # The chart is the server's SVG (the bench report's drawing code):
        # its hover titles hold each sample's rates; the newest generation
        # rate agrees with /metrics' counter over the last seconds.
        t1, m1 = time.time(), server.metrics_text()
        time.sleep(3)
        t2, m2 = time.time(), server.metrics_text()
        measured = (counter(m2, "generation_tokens_total") - counter(m1, "generation_tokens_total")) / (t2 - t1)
        bands = browser.execute_script(
            "return [...document.querySelectorAll('#tokens-chart .hover rect')]"
            ".map(r => [Number(r.dataset.x), r.querySelector('title').textContent]);")
        assert len(bands) > 1, bands
        at, title = bands[-1]
        assert abs(at - t2) < 3, (at, t2)
        clock, *values = title.split("\n")
        assert re.fullmatch(r"\d\d:\d\d:\d\d", clock), title
        shown = dict(v.split(": ") for v in values)
        assert abs(float(shown["generation tok/s"]) - measured) <= 0.25 * measured, (title, measured)
        panels = browser.execute_script(
            "return [...document.querySelectorAll('#latency figure')].map(f => f.dataset.latency);")
        assert panels == ["ttft", "itl", "e2e", "queue"], panels
        summary = browser.find_element(By.CSS_SELECTOR, '[data-latency="ttft"] .summary').text
        assert "(bucket bounds)" in summary, summary
        assert recent_row(browser, "browser-probe-"), "the probe is not in the recent requests"

        errors = [l for l in browser.get_log("browser") if l["level"] == "SEVERE"]
        assert not errors, errors

        browser.set_window_size(390, 844)
        time.sleep(1.5)
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
        assert overflow <= 0, f"{overflow} px wider than a phone"
    finally:
        server.stop()


def test_the_console_diagnoses_and_its_playground_streams(workdir, browser):
    """The demo model on the cpu executor: the playground streams a reply and
    shows its TTFT (seen by the page, and the server's own `metrics`, equal to
    the request's row in the recent requests); the diagnosis panel shows the
    findings the snapshot route gives."""
    server = Server(["--enable-per-request-metrics"], workdir,
                    model_args=["--executor", "cpu", "--model", "demo"])
    try:
        browser.get(server.base + "/")
        wait_for("live samples", lambda: browser.find_element(By.ID, "status").text.startswith("live,"))

        prompt = browser.find_element(By.ID, "pg-prompt")
        prompt.clear()
        prompt.send_keys("Tell me about the sea.")
        browser.find_element(By.ID, "pg-send").click()
        wait_for("the reply", lambda: browser.find_element(By.ID, "pg-status").text in ("done",)
                 or browser.find_element(By.ID, "pg-status").text.startswith("failed"), 60)
        assert browser.find_element(By.ID, "pg-status").text == "done"
        assert browser.find_element(By.ID, "pg-reply").text.strip(), "no text streamed"

        def timing(cls: str) -> str:
            return browser.find_element(By.CSS_SELECTOR, f"#pg-timings .{cls} dd").text

        client_ttft = timing("client-ttft")
        assert client_ttft != "–" and client_ttft.split()[-1] in ("µs", "ms", "s"), client_ttft
        assert timing("source") == "response metrics"
        server_ttft = timing("server-ttft")
        assert server_ttft != "–", server_ttft
        # The same request, as the recent requests show it (within a sample).
        cells = wait_for("the playground's row", lambda: recent_row(browser, "playground-"))
        assert cells[9] == server_ttft, (cells, server_ttft)

        # The diagnosis: the first needs two renders of /metrics 5 s apart.
        wait_for("findings", lambda: browser.find_elements(By.CSS_SELECTOR, "#findings .finding"), 30)
        def same_as_snapshot():
            shown = [e.get_attribute("data-id")
                     for e in browser.find_elements(By.CSS_SELECTOR, "#findings .finding")]
            snap = requests.get(server.base + "/console/api/snapshot", timeout=10).json()
            return shown and shown == [f["id"] for f in snap["findings"]["findings"]]
        wait_for("the snapshot's findings on the page", same_as_snapshot, 15)
        action = browser.find_element(By.CSS_SELECTOR, "#findings .finding .action").text
        assert action.startswith("→ "), action

        errors = [l for l in browser.get_log("browser") if l["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        server.stop()


def test_the_console_through_the_proxy_shows_llama_cpps_requests(llama_cpp_server, workdir, browser):
    """`inferscope proxy` in front of llama.cpp's server: `/console` lists a
    request sent through the proxy with a known `x-request-id`, with the
    tokens llama.cpp's `usage` gave; the engine-only panels are hidden."""
    import uuid

    from test_proxy import Proxy

    # llama-cpp-python's server refuses an x-request-id that is not a UUID.
    request_id = str(uuid.uuid4())
    proxy = Proxy(llama_cpp_server.base_url, workdir)
    try:
        client = openai.OpenAI(base_url=proxy.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        r = client.completions.create(model=llama_cpp_server.model, prompt="Hello there", max_tokens=6,
                                      extra_headers={"x-request-id": request_id})
        usage = {"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens}
        # A streamed one too: only a stream shows the proxy its first token.
        streamed_id = str(uuid.uuid4())
        chunks = list(client.completions.create(model=llama_cpp_server.model, prompt="Hello again", max_tokens=6,
                                                stream=True, extra_headers={"x-request-id": streamed_id}))
        assert chunks
        browser.get(proxy.base + "/console")
        wait_for("live samples", lambda: browser.find_element(By.ID, "status").text.startswith("live,"))

        cells = wait_for("the proxied request", lambda: recent_row(browser, request_id + "-0"))
        assert cells[4] == str(usage["prompt_tokens"]), (cells, usage)
        assert cells[5] == str(usage["completion_tokens"]), (cells, usage)
        assert cells[10] != "–", cells  # e2e, measured by the proxy
        assert cells[6] == cells[7] == "–", cells  # queue and prefill: only an engine knows them
        cells = wait_for("the streamed request", lambda: recent_row(browser, streamed_id + "-0"))
        assert cells[9] != "–", cells  # TTFT: the proxy saw the first token go by
        for panel in ("engines-panel", "steps-panel"):
            assert not browser.find_element(By.ID, panel).is_displayed(), panel
        panels = browser.execute_script(
            "return [...document.querySelectorAll('#latency figure')].map(f => f.dataset.latency);")
        assert panels == ["ttft", "itl", "e2e"], panels
        errors = [l for l in browser.get_log("browser") if l["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        proxy.stop()


def test_the_console_names_the_busiest_tenants(make_server, workdir, browser):
    """With an API key file the page asks for a key, then lists each request's
    tenant, the busiest tenants by the tokens of the requests listed (their
    `usage` summed), and filters by tenant."""
    import json

    keys = workdir / "console-tenant-keys.json"
    keys.write_text(json.dumps({"tenants": [{"name": "team-a", "key": "key-a"},
                                            {"name": "team-b", "key": "key-b"}]}))
    server = make_server(["--sim-profile", "tiny", "--api-key-file", str(keys)])
    tokens = {"team-a": 0, "team-b": 0}
    for i, (key, tenant) in enumerate([("key-a", "team-a")] * 3 + [("key-b", "team-b")]):
        r = requests.post(server.base + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": "sim-llama", "prompt": "hello " * (i + 1), "max_tokens": 5,
                                "ignore_eos": True}, timeout=30)
        assert r.status_code == 200, r.text
        tokens[tenant] += r.json()["usage"]["total_tokens"]

    browser.get(server.base + "/")
    wait_for("the key form", lambda: browser.find_element(By.ID, "keyform").is_displayed())
    browser.find_element(By.ID, "key").send_keys("key-b")
    browser.find_element(By.CSS_SELECTOR, "#keyform button").click()
    summary = wait_for("the tenants line", lambda: browser.find_element(By.ID, "tenants").text)
    share = round(100 * tokens["team-a"] / sum(tokens.values()))
    assert summary == (f"Busiest tenants over the 4 requests listed: team-a {tokens['team-a']} tokens "
                       f"({share} %), team-b {tokens['team-b']} tokens ({100 - share} %)"), (summary, tokens)
    browser.execute_script(
        "const s = document.getElementById('tenant-filter'); s.value = 'team-b';"
        "s.dispatchEvent(new Event('change'));")
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#recent tbody tr')]"
        ".map(tr => [...tr.querySelectorAll('td')].map(td => td.textContent));")
    assert [r[2] for r in rows] == ["team-b"], rows
    errors = [l for l in browser.get_log("browser") if l["level"] == "SEVERE"
              and "401" not in l["message"]]  # the first snapshot, before the key
    assert not errors, errors
