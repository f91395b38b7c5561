"""The official OpenAI Python client through `inferscope proxy` in front of
`inferscope serve --executor sim`: streamed and not, the same answers as
straight from the server, and the proxy's counts equal the server's own.
"""

from __future__ import annotations

import time

import openai
import pytest
import requests

from conftest import MODEL, InferscopeProcess


class Proxy(InferscopeProcess):
    """`inferscope proxy` on 127.0.0.1 and a free port."""

    def __init__(self, upstream: str, workdir, args: list[str] | None = None):
        super().__init__(["proxy", "--upstream", upstream, *(args or [])], workdir, "proxy",
                         "/metrics", timeout=30)


def total(text: str, name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    s = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            s += float(value)
    return s


@pytest.fixture(scope="module")
def upstream(make_server):
    return make_server(["--sim-profile", "tiny"])


@pytest.fixture(scope="module")
def proxy(upstream, workdir):
    p = Proxy(upstream.base, workdir)
    yield p
    p.stop()


@pytest.fixture(scope="module")
def make_server(workdir):
    # Module-scoped: the proxy's counts are compared with this server's alone.
    from conftest import Server
    started = []

    def make(args):
        s = Server(args, workdir)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def clients(upstream, proxy):
    mk = lambda base: openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)  # noqa: E731
    return mk(upstream.base), mk(proxy.base)


def test_openai_client_through_the_proxy(upstream, proxy):
    direct, via = clients(upstream, proxy)
    assert [m.id for m in via.models.list().data] == [MODEL]

    # Not streamed: the same completion as straight from the server (seeded sim).
    a = direct.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=9, seed=3,
                                  extra_body={"ignore_eos": True})
    b = via.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=9, seed=3,
                               extra_body={"ignore_eos": True})
    assert b.choices[0].text == a.choices[0].text
    assert b.usage == a.usage
    assert b.choices[0].finish_reason == "length"

    # Streamed without usage: the proxy asked for it upstream, the client sees none.
    chunks = list(via.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream please."}], max_tokens=12, seed=9,
        stream=True, extra_body={"ignore_eos": True}))
    assert chunks and all(c.choices for c in chunks), "no usage chunk the client did not ask for"
    assert all(c.usage is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    plain = direct.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Stream please."}], max_tokens=12, seed=9,
        extra_body={"ignore_eos": True})
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"

    # Streamed with usage: exactly one usage chunk, as the client asked.
    usage = [c.usage for c in via.completions.create(
        model=MODEL, prompt="Hello", max_tokens=7, seed=1, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}) if not c.choices]
    assert len(usage) == 1 and usage[0].completion_tokens == 7

    # Errors pass through as the server answered them.
    with pytest.raises(openai.NotFoundError):
        via.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_proxy_counts_equal_the_servers(upstream, proxy):
    # The server also counted the direct requests of the test above: compare
    # the increments of both over a burst sent through the proxy only.
    _, via = clients(upstream, proxy)
    before_s, before_p = upstream.metrics_text(), proxy.metrics_text()
    prom = _names(before_p)[0]
    for i in range(4):
        list(via.completions.create(model=MODEL, prompt=f"burst {i}", max_tokens=5 + i, seed=i, stream=True,
                                    extra_body={"ignore_eos": True}))
    via.completions.create(model=MODEL, prompt="plain", max_tokens=4, seed=7, extra_body={"ignore_eos": True})
    deadline = time.monotonic() + 10
    while True:
        after_s, after_p = upstream.metrics_text(), proxy.metrics_text()
        ds = {n: total(after_s, n) - total(before_s, n) for n in _names(after_s)}
        dp = {n: total(after_p, n) - total(before_p, n) for n in _names(after_p)}
        if ds[prom] == 5 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for name in _names(after_p):
        assert dp[name] == ds[name], f"{name}: proxy +{dp[name]}, server +{ds[name]}"
    assert dp[prom] == 5
    assert total(after_p, prom, finished_reason="length") - total(before_p, prom, finished_reason="length") == 5


def _names(text: str) -> list[str]:
    """The counters both sides expose under the same names."""
    ns = "inferscope:" if "inferscope:" in text else "inferscope_"
    return [f"{ns}request_success_total", f"{ns}prompt_tokens_total", f"{ns}generation_tokens_total"]


def test_proxy_in_front_of_llama_cpp(llama_cpp_server, workdir):
    """A third-party upstream: llama.cpp's server (llama-cpp-python) serving a tiny GGUF."""
    up = llama_cpp_server
    p = Proxy(up.base_url, workdir)
    try:
        via = openai.OpenAI(base_url=p.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        direct = openai.OpenAI(base_url=up.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        text = p.metrics_text()
        ns = "inferscope:" if "inferscope:" in text else "inferscope_"
        assert f'model_name="{up.model}"' in text, "label from llama.cpp's /v1/models"

        r = via.completions.create(model=up.model, prompt="Hello there", max_tokens=8)
        assert r.usage.completion_tokens > 0
        chunks = list(via.completions.create(model=up.model, prompt="Hello again", max_tokens=8, stream=True))
        assert chunks and all(c.choices for c in chunks), "no usage chunk the client did not ask for"
        # Does this server answer include_usage at all? (Then the proxy counted the stream's tokens.)
        usage = [c.usage for c in direct.completions.create(
            model=up.model, prompt="Hello again", max_tokens=8, stream=True,
            stream_options={"include_usage": True}) if c.usage is not None]

        text = p.metrics_text()
        assert total(text, f"{ns}request_success_total") == 2
        stream_prompt = usage[-1].prompt_tokens if usage else 0
        assert total(text, f"{ns}prompt_tokens_total") == r.usage.prompt_tokens + stream_prompt
        if usage:
            # The proxied stream's own count: at least one token, at most max_tokens.
            assert r.usage.completion_tokens < total(text, f"{ns}generation_tokens_total") <= r.usage.completion_tokens + 8
        else:
            # No usage chunk from this upstream: the stream's tokens are counted
            # as relayed, one per content chunk the client received.
            relayed = sum(1 for c in chunks if c.choices[0].text)
            assert relayed > 0
            assert total(text, f"{ns}generation_tokens_total") == r.usage.completion_tokens + relayed
        assert total(text, f"{ns}time_to_first_token_seconds_count") == 1, "the stream's TTFT"
        assert total(text, f"{ns}e2e_request_latency_seconds_count") == 2
        assert f"{ns}kv_cache_usage_perc" not in text, "engine-only series are absent"
        # llama-cpp-python's server has no /metrics: --upstream-metrics has nothing to re-expose.
        assert requests.get(up.base_url + "/metrics", timeout=10).status_code == 404
    finally:
        p.stop()
