"""The console's engine-step timeline (docs/console.md, "Engine steps") in a
real browser: with two sim engines under load, the page draws each engine's
steps, a hovered step lists requests the server is running, and scrolling
over a chart zooms it, with no script error.
"""

from __future__ import annotations

import threading
import time

import requests
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By

from test_console_browser import browser, wait_for  # noqa: F401 (a fixture)


def test_the_step_timeline_draws_each_engines_steps(make_server, browser):  # noqa: F811
    server = make_server(["--sim-profile", "tiny,t_weights_ms=20", "--data-parallel-size", "2"])

    def long_request(i: int):
        try:
            requests.post(server.base + "/v1/completions", headers={"x-request-id": f"steps-load-{i}"},
                          json={"model": "sim-llama", "prompt": "load", "max_tokens": 4000,
                                "min_tokens": 4000, "ignore_eos": True}, timeout=120)
        except requests.RequestException:
            pass  # the server stops first

    load = [threading.Thread(target=long_request, args=(i,), daemon=True) for i in range(4)]
    for t in load:
        t.start()
    try:
        browser.get(server.base + "/")
        # Read in one script: the panel redraws each second.
        captions = wait_for("both engines' steps", lambda: (lambda c: c if len(c) == 2 and all(
            ": 0 steps" not in t for t in c) else None)(browser.execute_script(
                "return [...document.querySelectorAll('#steps figcaption')].map(f => f.textContent);")))
        assert len(captions) == 2 and captions[0].startswith("engine 0"), captions
        # Paused, the drawing stays; a step of engine 1: its tooltip lists
        # the load's requests, decoding.
        browser.find_element(By.XPATH, "//section//button[text()='pause']").click()
        phases = browser.find_elements(By.CSS_SELECTOR, "#steps figure:nth-of-type(2) svg g rect")
        assert phases, "no step drawn"
        # The newest step's execute phase (three phase rects, two token bars a step).
        ActionChains(browser).move_to_element(phases[-4]).perform()
        text = wait_for("a tooltip", lambda: browser.find_element(By.ID, "tooltip").text)
        assert "steps-load-" in text and "decode 1" in text, text
        assert "device" in text and "host" in text, text

        before = browser.find_element(By.ID, "steps-window").get_attribute("value")
        browser.execute_script(
            "document.querySelector('#steps svg').dispatchEvent(new WheelEvent('wheel', {deltaY: -100, bubbles: true, cancelable: true}));")
        after = browser.find_element(By.ID, "steps-window").get_attribute("value")
        assert float(after) < float(before), (before, after)

        errors = [l for l in browser.get_log("browser") if l["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        server.stop()
