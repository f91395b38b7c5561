#!/usr/bin/env python3
"""Screenshots of the console under load, for docs/img/ (docs/console.md).

Starts `inferscope serve --executor sim` with two engines, holds it at a
steady load of varied requests, opens the console in headless chromium
(Debian's `chromium` and `chromium-driver`, `selenium` from PyPI), sends one
request from the playground, and saves:

- docs/img/console.png: the top of the page at 1280x800 (engines, diagnosis,
  throughput);
- docs/img/console-latency.png, console-steps.png, console-playground.png:
  those panels;
- docs/img/console-phone.png: the top at a phone's width (390x844).

    cargo build --release -p inferscope
    python scripts/console-screenshots.py [path/to/inferscope]
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

ROOT = Path(__file__).resolve().parent.parent
IMG = ROOT / "docs" / "img"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    binary = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "target" / "release" / "inferscope")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [binary, "serve", "--executor", "sim", "--model", "sim-llama", "--port", str(port),
         "--sim-profile", "tiny,t_weights_ms=20", "--data-parallel-size", "2", "--max-num-seqs", "4",
         "--enable-per-request-metrics", "--disable-log-stats"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()

    def client(i: int) -> None:
        n = 0
        while not stop.is_set():
            try:
                requests.post(base + "/v1/completions", timeout=60, json={
                    "model": "sim-llama", "prompt": "x" * (50 + 30 * i), "max_tokens": 40 + n % 60})
            except requests.RequestException:
                time.sleep(0.1)
            n += 1

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        for _ in range(100):
            try:
                requests.get(base + "/health", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.1)
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(10)]
        for t in threads:
            t.start()
        driver.set_window_size(1280, 800)
        driver.get(base + "/")
        # Two diagnoses and a minute of history.
        time.sleep(40)
        driver.find_element(By.ID, "pg-send").click()
        time.sleep(4)
        IMG.mkdir(parents=True, exist_ok=True)
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(1.2)
        driver.save_screenshot(str(IMG / "console.png"))
        for panel, name in (("latency", "console-latency"), ("steps-panel", "console-steps"),
                            ("playground-panel", "console-playground")):
            element = driver.find_element(By.ID, panel)
            driver.execute_script("arguments[0].scrollIntoView()", element)
            time.sleep(1.2)
            element.screenshot(str(IMG / f"{name}.png"))
        driver.set_window_size(390, 844)
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(1.5)
        driver.save_screenshot(str(IMG / "console-phone.png"))
    finally:
        stop.set()
        driver.quit()
        server.terminate()
        server.wait(timeout=10)
    print("wrote", ", ".join(p.name for p in sorted(IMG.glob("console*.png"))))


if __name__ == "__main__":
    main()
