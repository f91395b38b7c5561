"""The HTML report of `bench serve` in a real browser (Debian's headless chromium).

A short `bench serve --report-html` against `inferscope serve --executor sim`;
then chromium loads the page with a small checking script appended (the page
itself has no script): every chart's SVG lines must have a rendered length and
a non-empty bounding box, and chromium must log no console error. A copy with
one chart broken on purpose must be caught, so the check itself is checked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import INFERSCOPE_BIN

CHROMIUM = os.environ.get("CHROMIUM_BIN") or shutil.which("chromium") or "/usr/bin/chromium"

# Runs after layout: marks each chart with what it drew and records errors.
CHECK = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
window.addEventListener('load', () => {
  const out = [];
  for (const fig of document.querySelectorAll('figure.chart')) {
    let drawn = 0;
    for (const line of fig.querySelectorAll('svg polyline')) {
      const b = line.getBBox();
      if (line.points.numberOfItems > 1 && line.getTotalLength() > 0 && (b.width > 0 || b.height > 0)) drawn++;
    }
    // A series of one point is drawn as a dot.
    for (const dot of fig.querySelectorAll('svg circle')) {
      if (dot.getBBox().width > 0) drawn++;
    }
    const texts = fig.querySelectorAll('svg text').length;
    out.push(fig.dataset.chart + ':' + drawn + ':' + texts);
  }
  const pre = document.createElement('pre');
  pre.id = 'chart-check';
  pre.textContent = JSON.stringify({charts: out, errors: window.__errors});
  document.body.appendChild(pre);
});
</script>
"""


def chromium(args: list[str], workdir: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    profile = workdir / "chromium-profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
           "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def console_errors(stderr: str) -> list[str]:
    # Chromium logs page console messages as "...:CONSOLE(line)] ..." or
    # "...:CONSOLE:line] ..."; errors and uncaught exceptions name themselves.
    return [l for l in stderr.splitlines()
            if "CONSOLE" in l and re.search(r"error|uncaught|failed", l, re.I)]


def check_page(page: Path, workdir: Path) -> dict:
    import json
    checked = page.with_name(page.stem + "-checked.html")
    checked.write_text(page.read_text().replace("</body>", CHECK + "</body>"))
    res = chromium(["--virtual-time-budget=5000", "--dump-dom", checked.as_uri()], workdir)
    assert res.returncode == 0, f"chromium failed ({res.returncode}):\n{res.stderr[-3000:]}"
    m = re.search(r'<pre id="chart-check">(.*?)</pre>', res.stdout, re.S)
    assert m, f"the checking script did not run:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    text = m.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    out = json.loads(text)
    out["console_errors"] = console_errors(res.stderr)
    return out


def undrawn(result: dict) -> list[str]:
    return [c for c in result["charts"] if int(c.split(":")[1]) == 0 or int(c.split(":")[2]) < 5]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed (.ci/run installs it)")
def test_report_renders_in_chromium(make_server, workdir):
    server = make_server([])
    report = workdir / "report.html"
    bench = subprocess.run(
        [str(INFERSCOPE_BIN), "bench", "serve", "--base-url", server.base, "--num-prompts", "40",
         "--request-rate", "40", "--random-input-len", "64", "--random-output-len", "24", "--ignore-eos",
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
         "--scrape-metrics", "--scrape-interval", "0.1", "--slice-duration", "0.25",
         "--report-html", str(report), "--disable-tqdm"],
        capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, f"bench failed:\n{bench.stdout[-3000:]}\n{bench.stderr[-3000:]}"
    assert report.exists(), bench.stdout[-2000:]

    result = check_page(report, workdir)
    names = [c.split(":")[0] for c in result["charts"]]
    for want in ["cdf-ttft", "cdf-tpot", "cdf-itl", "cdf-e2el", "in-flight", "output-tps", "ttft-by-arrival",
                 "server-queue", "server-kv", "server-device", "server-preemptions", "slices-latency",
                 "slices-throughput"]:
        assert want in names, f"{want} missing: {names}"
    assert not undrawn(result), f"charts that drew nothing: {undrawn(result)}"
    assert not result["errors"], result["errors"]
    assert not result["console_errors"], result["console_errors"]

    # The check catches a broken chart: one polyline without points, and a
    # script error.
    broken = workdir / "broken.html"
    html = report.read_text()
    html = re.sub(r'(<figure class="chart" data-chart="cdf-ttft">.*?<polyline[^>]*points=")[^"]*"',
                  r'\1"', html, count=1, flags=re.S)
    html = html.replace("</body>", "<script>console.error('planted'); undefinedFunction();</script></body>")
    broken.write_text(html)
    bad = check_page(broken, workdir)
    assert any(c.startswith("cdf-ttft:") for c in undrawn(bad)), bad
    assert bad["console_errors"], "a planted console error went unseen"

    # The screenshot for the docs, when asked for (INFERSCOPE_SCREENSHOT=path).
    shot = os.environ.get("INFERSCOPE_SCREENSHOT")
    if shot:
        size = os.environ.get("INFERSCOPE_SCREENSHOT_SIZE", "1700,3000")
        res = chromium([f"--window-size={size}", "--hide-scrollbars", f"--screenshot={shot}", report.as_uri()],
                       workdir)
        assert res.returncode == 0, res.stderr[-2000:]
