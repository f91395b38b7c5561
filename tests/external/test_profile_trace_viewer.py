"""A profile (`--profile-dir`, `POST /start_profile` / `/stop_profile`) read
by a real trace viewer: the Performance panel's trace engine of the DevTools
that ship inside Debian's chromium (docs/console.md, "Profiles").

Why not chrome://tracing: Debian builds chromium without the catapult trace
viewer behind it (its `disable/catapult.patch`); with the internal debug
pages enabled (the `internal_only_uis_enabled` local-state pref, set here as
chromedriver's `localState`) chrome://tracing still answers ERR_FAILED.
DevTools' engine models each thread's complete slices as a tree and the
processes' names; it has no model of generic nestable async events, so the
request tracks are checked by the Rust tests, not here.
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest
import requests
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service

from test_console_browser import CHROMEDRIVER

DEVTOOLS = "devtools://devtools/bundled/devtools_app.html"

# Parses the trace with DevTools' own engine (the module its Performance
# panel loads a file with) and returns, per process, its name and per thread
# the slices as DevTools nested them.
PARSE = """
const [text, done] = [arguments[0], arguments[arguments.length - 1]];
import('./models/trace/trace.js').then(async T => {
  const file = JSON.parse(text);
  const model = T.TraceModel.Model.createWithAllHandlers();
  await model.parse(file.traceEvents, {metadata: file.otherData || {}});
  const data = model.parsedTrace(0).data;
  const nodes = data.Renderer.entryToNode;
  const processes = [...data.Renderer.processes.entries()].map(([pid, p]) => ({
    pid, name: data.Meta.processNames.get(pid)?.args?.name ?? null,
    threads: [...p.threads.values()].map(t => ({
      name: t.name,
      roots: t.entries.filter(e => !nodes.get(e)?.parent).map(e => ({
        name: e.name, args: e.args,
        children: (nodes.get(e)?.children ?? []).map(c => c.entry.name),
      })),
    })),
  }));
  done({processes, warnings: Object.keys(data.Warnings.perWarning)});
}).catch(e => done({error: String(e && e.stack || e)}));
"""


@pytest.fixture
def devtools():
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


def test_devtools_reads_each_engines_steps_from_a_profile(make_server, devtools, workdir):
    profile_dir = workdir / "profiles-devtools"
    server = make_server(["--sim-profile", "tiny,t_fixed_ms=2", "--data-parallel-size", "2",
                          "--profile-dir", str(profile_dir)])
    r = requests.post(server.base + "/start_profile", timeout=10)
    assert r.status_code == 200, r.text
    ids = [f"viewer-{i}" for i in range(6)]

    def send(rid: str):
        r = requests.post(server.base + "/v1/completions", headers={"x-request-id": rid},
                          json={"model": "sim-llama", "prompt": "profile " * 8, "max_tokens": 12,
                                "ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text

    senders = [threading.Thread(target=send, args=(rid,)) for rid in ids]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    stop = requests.post(server.base + "/stop_profile", timeout=60)
    assert stop.status_code == 200, stop.text
    answer = stop.json()
    assert answer["engines"] == [0, 1], answer

    devtools.get(DEVTOOLS)
    parsed = devtools.execute_async_script(PARSE, Path(answer["path"]).read_text())
    assert "error" not in parsed, parsed.get("error")
    assert parsed["warnings"] == [], parsed["warnings"]

    engines = {p["name"]: p for p in parsed["processes"]}
    assert set(engines) == {"engine 0", "engine 1"}, list(engines)
    steps_seen = 0
    batched: set[str] = set()
    for name, process in engines.items():
        # One track per engine: its steps thread, every root slice a step
        # whose children, in order, are the engine loop's three phases.
        assert [t["name"] for t in process["threads"]] == ["steps"], (name, process["threads"])
        roots = process["threads"][0]["roots"]
        steps = [s for s in roots if s["name"] == "step"]
        assert steps and len(steps) == len(roots), (name, {s["name"] for s in roots})
        for s in steps:
            assert s["children"] == ["schedule", "execute", "postprocess"], (name, s)
            batched.update(q["request_id"] for q in s["args"]["batch"])
        steps_seen += len(steps)
    assert steps_seen == answer["steps"], (steps_seen, answer)
    # The engine request ids the steps ran are the requests sent, by their
    # x-request-id (the engine appends a suffix), and nothing else.
    assert {rid.rsplit("-", 1)[0] for rid in batched} == set(ids), batched
    server.stop()
