"""Fixtures of the external suite: the release binary, a real Prometheus, promtool.

Environment:
  INFERSCOPE_BIN   the binary (default: <repo>/target/release/inferscope)
  PROMETHEUS_BIN   default /usr/bin/prometheus (Debian's `prometheus` package)
  PROMTOOL_BIN     default /usr/bin/promtool (same package)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
INFERSCOPE_BIN = Path(os.environ.get("INFERSCOPE_BIN", REPO / "target" / "release" / "inferscope"))
PROMETHEUS_BIN = os.environ.get("PROMETHEUS_BIN", "/usr/bin/prometheus")
PROMTOOL_BIN = os.environ.get("PROMTOOL_BIN", "/usr/bin/promtool")
MODEL = "sim-llama"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _stop(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


class Server:
    """`inferscope serve --executor sim` on 127.0.0.1 and a free port."""

    def __init__(self, args: list[str], workdir: Path):
        if not INFERSCOPE_BIN.exists():
            pytest.fail(f"{INFERSCOPE_BIN} missing: run `cargo build --release -p inferscope` first")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"server-{self.port}.log"
        cmd = [str(INFERSCOPE_BIN), "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--executor", "sim", "--model", MODEL, "--shutdown-timeout", "1", *args]
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{_tail(self.log)}")
            try:
                if requests.get(self.base + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                _stop(self.proc)
                pytest.fail(f"server not healthy after 60 s:\n{_tail(self.log)}")
            time.sleep(0.1)

    def metrics_text(self) -> str:
        r = requests.get(self.base + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def stop(self) -> None:
        _stop(self.proc)


class Prometheus:
    """Debian's Prometheus server scraping `targets` every second."""

    def __init__(self, targets: list[str], workdir: Path, scrape_interval: str = "1s"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="prom-", dir=workdir))
        self.config = self.dir / "prometheus.yml"
        target_list = ", ".join(f"'{t}'" for t in targets)
        self.config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  scrape_timeout: {scrape_interval}\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: inferscope\n"
            "    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: [{target_list}]\n"
        )
        self.log = self.dir / "prometheus.log"
        self.proc = subprocess.Popen(
            [PROMETHEUS_BIN, f"--config.file={self.config}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=self.dir)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode}:\n{_tail(self.log)}")
            try:
                if requests.get(self.base + "/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                _stop(self.proc)
                pytest.fail(f"prometheus not ready after 60 s:\n{_tail(self.log)}")
            time.sleep(0.2)

    def query(self, expr: str, at: float | str | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = at if isinstance(at, str) else f"{at:.3f}"
        r = requests.get(self.base + "/api/v1/query", params=params, timeout=30)
        body = r.json()
        assert body.get("status") == "success", f"query {expr!r} failed: {body}"
        return body["data"]["result"]

    def scalar(self, expr: str, at: float | str | None = None) -> float:
        """The value of a query that must return exactly one sample."""
        res = self.query(expr, at)
        assert len(res) == 1, f"{expr!r} returned {len(res)} series: {res}"
        return float(res[0]["value"][1])

    def last_scrape(self) -> float | None:
        """Timestamp (seconds, ms precision) of the latest scrape of the job if
        it succeeded (`up` == 1), else None."""
        now = f"{time.time():.3f}"
        ts = self.query('timestamp(up{job="inferscope"})', now)
        up = self.query('up{job="inferscope"}', now)
        if not ts or not up or any(float(s["value"][1]) != 1.0 for s in up):
            return None
        return min(float(s["value"][1]) for s in ts)

    def wait_scrape_after(self, t: float, timeout: float = 30.0) -> float:
        """Waits for a scrape that started after wall-clock time `t`; returns its timestamp."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ts = self.last_scrape()
            if ts is not None and ts > t:
                return ts
            time.sleep(0.2)
        raise AssertionError(f"no scrape after {t} within {timeout} s:\n{_tail(self.log)}")

    def stop(self) -> None:
        _stop(self.proc)


@pytest.fixture(scope="session")
def workdir():
    d = Path(tempfile.mkdtemp(prefix="inferscope-ext-"))
    yield d
    if os.environ.get("KEEP_EXTERNAL_TMP") != "1":
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def sim_server(workdir):
    """One engine, the quick `tiny` cost model: for the API tests."""
    s = Server(["--sim-profile", "tiny"], workdir)
    yield s
    s.stop()


@pytest.fixture
def make_server(workdir):
    started: list[Server] = []

    def make(args: list[str]) -> Server:
        s = Server(args, workdir)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def make_prometheus(workdir):
    started: list[Prometheus] = []

    def make(targets: list[str]) -> Prometheus:
        p = Prometheus(targets, workdir)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL_BIN, *args], input=stdin, capture_output=True, text=True, timeout=120)
