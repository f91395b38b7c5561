"""Fixtures of the external suite: the release binary, a real Prometheus, promtool.

Environment:
  INFERSCOPE_BIN   the binary (default: <repo>/target/release/inferscope)
  PROMETHEUS_BIN   default /usr/bin/prometheus (Debian's `prometheus` package)
  PROMTOOL_BIN     default /usr/bin/promtool (same package)

The third-party server (`llama_cpp_server`) is llama.cpp's OpenAI-compatible
server from the `llama-cpp-python[server]` package, which .ci/run installs into
the suite's virtual environment (built from source once, then cached).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
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

# The servers' packed-weights caches (GGUF panels saved for a restart) go to
# a directory of this run, removed at its end, not to the user's ~/.cache.
_PACKED_CACHE = tempfile.mkdtemp(prefix="inferscope-ext-cache-")
os.environ["INFERSCOPE_CACHE_DIR"] = _PACKED_CACHE
atexit.register(shutil.rmtree, _PACKED_CACHE, ignore_errors=True)


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


def _wait_ready(proc: subprocess.Popen, url: str, log: Path, what: str, timeout: float = 60) -> None:
    """Polls `url` until it answers 200; fails with the log's tail if `proc` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        if time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(f"{what} not ready after {timeout:.0f} s:\n{_tail(log)}")
        time.sleep(0.1)


class InferscopeProcess:
    """`inferscope SUBCOMMAND … --host 127.0.0.1 --port P` on a free port, ready
    once `ready_path` answers 200."""

    def __init__(self, subcommand: list[str], workdir: Path, what: str, ready_path: str,
                 timeout: float = 60):
        if not INFERSCOPE_BIN.exists():
            pytest.fail(f"{INFERSCOPE_BIN} missing: run `cargo build --release -p inferscope` first")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{what}-{self.port}.log"
        self.cmd = [str(INFERSCOPE_BIN), *subcommand, "--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        _wait_ready(self.proc, self.base + ready_path, self.log, what, timeout)

    def metrics_text(self) -> str:
        r = requests.get(self.base + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def stop(self) -> None:
        _stop(self.proc)


class Server(InferscopeProcess):
    """`inferscope serve` on 127.0.0.1 and a free port: the sim executor unless
    `model_args` names another executor and model."""

    def __init__(self, args: list[str], workdir: Path, model_args: list[str] | None = None):
        if model_args is None:
            model_args = ["--executor", "sim", "--model", MODEL]
        super().__init__(["serve", *model_args, "--shutdown-timeout", "1", *args], workdir,
                         "server", "/health")


class Prometheus:
    """Debian's Prometheus server scraping `targets` every second."""

    def __init__(self, targets: list[str], workdir: Path, scrape_interval: str = "1s",
                 extra_args: tuple[str, ...] = ()):
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
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *extra_args],
            stdout=self.log.open("wb"), stderr=subprocess.STDOUT, cwd=self.dir)
        _wait_ready(self.proc, self.base + "/-/ready", self.log, "prometheus")

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


@pytest.fixture(scope="session")
def demo_server(workdir):
    """The built-in demo model on the cpu executor: for tests of what a real
    model's logits do (structured outputs, bad_words)."""
    s = Server([], workdir, model_args=["--executor", "cpu", "--model", "demo"])
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

    def make(targets: list[str], extra_args: tuple[str, ...] = ()) -> Prometheus:
        p = Prometheus(targets, workdir, extra_args=extra_args)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


class LlamaCppServer:
    """llama.cpp's OpenAI-compatible server (`python -m llama_cpp.server`) on
    127.0.0.1 and a free port, serving `gguf_path` as `model`."""

    def __init__(self, gguf_path: Path, workdir: Path, model: str = "tiny-llama"):
        try:
            import llama_cpp  # noqa: F401  (only to fail early with a clear message)
        except ImportError as e:
            pytest.fail(f"llama-cpp-python is not installed ({e}); .ci/run installs it "
                        "(`pip install llama-cpp-python[server]`)")
        self.gguf_path = gguf_path
        self.model = model
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"llama-cpp-{self.port}.log"
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path),
               "--model_alias", model, "--host", "127.0.0.1", "--port", str(self.port),
               "--n_ctx", "4096", "--n_threads", "2", "--verbose", "false"]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        _wait_ready(self.proc, self.base_url + "/v1/models", self.log, "llama.cpp server", timeout=120)

    def stop(self) -> None:
        _stop(self.proc)


@pytest.fixture(scope="session")
def tiny_gguf(workdir) -> Path:
    """A tiny random-weight Llama GGUF with a SentencePiece vocabulary (tiny_gguf.py)."""
    from tiny_gguf import write_tiny_llama

    return write_tiny_llama(workdir / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def llama_cpp_server(tiny_gguf, workdir):
    """A third-party OpenAI-compatible server: llama.cpp serving `tiny_gguf`."""
    s = LlamaCppServer(tiny_gguf, workdir)
    yield s
    s.stop()


def run_promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL_BIN, *args], input=stdin, capture_output=True, text=True, timeout=120)
