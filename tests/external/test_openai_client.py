"""The official OpenAI Python client against `inferscope serve --executor sim`.

The sim executor samples from a generator seeded by the request's `seed`, with
the byte tokenizer (one token per byte), so outputs are reproducible and stop
strings can be chosen from a first run's text.
"""

from __future__ import annotations

import openai
import pytest
import requests

from conftest import MODEL


def client_for(server, api_key: str = "unused") -> openai.OpenAI:
    # No retries: a 429 or 5xx must surface as the exception, not be retried away.
    return openai.OpenAI(base_url=server.base + "/v1", api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(sim_server):
    return client_for(sim_server)


def test_models_list(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL]
    assert models.data[0].object == "model"
    assert models.data[0].owned_by
    # vllm bench serve reads `root` when --model is not given.
    assert (models.data[0].model_extra or {}).get("root") == MODEL


def test_completion_exact_max_tokens_with_ignore_eos(client):
    for n in (1, 7, 64):
        r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=n,
                                      seed=3, extra_body={"ignore_eos": True})
        assert r.object == "text_completion"
        assert r.model == MODEL
        assert len(r.choices) == 1
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == n
        assert r.usage.prompt_tokens > 0
        assert r.usage.total_tokens == r.usage.prompt_tokens + n


def test_completion_stream_with_usage_chunk(client):
    plain = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, seed=11,
                                      extra_body={"ignore_eos": True})
    stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, seed=11,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    text, finish, usage_chunks, content_chunks = "", None, [], 0
    for chunk in stream:
        assert chunk.object == "text_completion"
        if not chunk.choices:
            usage_chunks.append(chunk)
            continue
        assert chunk.usage is None, "usage must only come in the final chunk with empty choices"
        content_chunks += 1
        text += chunk.choices[0].text
        if chunk.choices[0].finish_reason is not None:
            finish = chunk.choices[0].finish_reason
    assert finish == "length"
    assert content_chunks >= 1
    assert len(usage_chunks) == 1
    usage = usage_chunks[0].usage
    assert usage.completion_tokens == 24
    assert usage.total_tokens == usage.prompt_tokens + 24
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    # Same seed, same tokens: streaming and not agree.
    assert text == plain.choices[0].text


def test_completion_stream_without_usage(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, seed=1, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert chunks and all(c.choices for c in chunks), "no usage chunk unless include_usage"


def test_chat_completion(client):
    for kwargs in ({"max_completion_tokens": 12}, {"max_tokens": 12}):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "Say something."}],
            seed=5, extra_body={"ignore_eos": True}, **kwargs)
        assert r.object == "chat.completion"
        assert r.choices[0].message.role == "assistant"
        assert isinstance(r.choices[0].message.content, str)
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 12


def test_chat_content_parts(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                            {"type": "text", "text": " there"}]}],
        max_tokens=4, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 4


def test_chat_stream_with_usage_chunk(client):
    messages = [{"role": "user", "content": "Stream please."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, seed=9,
                                           extra_body={"ignore_eos": True})
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, seed=9,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if not chunk.choices:
            assert usage is None, "one usage chunk"
            usage = chunk.usage
            continue
        assert chunk.choices[0].delta is not None
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length"
    assert usage is not None and usage.completion_tokens == 20
    assert text == plain.choices[0].message.content


def test_stop_string(client):
    base = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, seed=21,
                                     extra_body={"ignore_eos": True})
    text = base.choices[0].text
    assert len(text) >= 20, text
    stop = text[12:14]
    expected = text[: text.index(stop)]
    r = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, seed=21, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == expected, (stop, text)
    # Streaming honours it too, and never leaks the stop string.
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="stop test", max_tokens=40, seed=21, stop=stop, stream=True,
        extra_body={"ignore_eos": True}) if c.choices)
    assert streamed == expected


def test_request_id_is_echoed(client):
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=1, extra_headers={"x-request-id": "ext-suite-42"})
    assert raw.headers.get("x-request-id") == "ext-suite-42"
    assert raw.parse().usage.completion_tokens <= 1


# --- error responses, as the client raises them -----------------------------------------

def _check_error(exc: openai.APIStatusError, status: int):
    assert exc.status_code == status
    body = exc.body
    assert isinstance(body, dict) and body.get("message"), body
    assert body.get("type"), body


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    _check_error(e.value, 404)
    assert "no-such-model" in e.value.body["message"]


@pytest.mark.parametrize("kwargs,param", [
    ({"max_tokens": 10_000_000}, "max_tokens"),
    ({"max_tokens": 4, "temperature": -1.0}, "temperature"),
    ({"max_tokens": 4, "top_p": 0.0}, "top_p"),
    ({"max_tokens": 4, "n": 0}, "n"),
])
def test_invalid_completion_is_bad_request(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="x", **kwargs)
    _check_error(e.value, 400)
    assert e.value.body.get("type") == "invalid_request_error"
    assert e.value.body.get("param") == param


_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("kwargs,param", [
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    # Tools without tool_choice mean "auto", which needs --enable-auto-tool-choice (vLLM).
    ({"tools": [_TOOL]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"logit_bias": {"99999": 5}}, "logit_bias"),
    ({"extra_body": {"guided_regex": "a("}}, "guided_regex"),
])
def test_chat_fields_not_honoured_are_bad_requests(client, kwargs, param):
    # What the client sends for each is refused by name, never silently ignored (docs/api.md).
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, **kwargs)
    _check_error(e.value, 400)
    assert e.value.body.get("param") == param


def test_sampler_fields_are_accepted(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1,
        presence_penalty=1.0, frequency_penalty=-0.5, logit_bias={"65": 5}, user="u-1",
        extra_body={"min_p": 0.1, "repetition_penalty": 1.2, "min_tokens": 4})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4


def test_empty_messages_is_bad_request(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=4)
    _check_error(e.value, 400)


def test_streaming_error_before_first_token_is_an_http_error(client):
    # Validation happens before the stream starts, so the client raises on create().
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=10_000_000, stream=True)


def test_api_key(make_server):
    server = make_server(["--sim-profile", "tiny", "--api-key", "sekret"])
    with pytest.raises(openai.AuthenticationError) as e:
        client_for(server, api_key="wrong").models.list()
    _check_error(e.value, 401)
    ok = client_for(server, api_key="sekret").completions.create(
        model=MODEL, prompt="x", max_tokens=3, extra_body={"ignore_eos": True})
    assert ok.usage.completion_tokens == 3


def test_admission_control_is_rate_limit_error(make_server):
    import concurrent.futures as cf

    # A slow engine (100 ms per step) and room for one waiting request: of many
    # simultaneous requests, some must be refused with 429.
    server = make_server(["--sim-profile", "tiny,t_fixed_ms=100", "--max-num-seqs", "1",
                          "--max-waiting-requests", "1"])
    c = client_for(server)

    def one(_):
        try:
            c.completions.create(model=MODEL, prompt="x", max_tokens=5, extra_body={"ignore_eos": True})
            return "ok"
        except openai.RateLimitError as exc:
            _check_error(exc, 429)
            return "429"

    with cf.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(one, range(8)))
    assert "429" in outcomes and "ok" in outcomes, outcomes


def test_completion_prompt_forms(client):
    # A list of strings: one choice per prompt, indexed in order.
    r = client.completions.create(model=MODEL, prompt=["first", "second", "third"], max_tokens=3,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 9
    # Token ids, and a list of token-id lists.
    r = client.completions.create(model=MODEL, prompt=[72, 105, 33], max_tokens=2, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 2
    r = client.completions.create(model=MODEL, prompt=[[72, 105], [33, 33, 33]], max_tokens=2,
                                  extra_body={"ignore_eos": True})
    assert len(r.choices) == 2 and r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 4


def test_n_choices(client):
    r = client.completions.create(model=MODEL, prompt="n test", max_tokens=4, n=2, seed=1,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert r.usage.completion_tokens == 8


def test_chat_stream_first_chunk_carries_content(client):
    # Benchmark clients time TTFT at the first chunk with choices: it must carry content.
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=5, stream=True, extra_body={"ignore_eos": True})
    first = next(c for c in stream if c.choices)
    assert first.choices[0].delta.content, first
    for _ in stream:
        pass


def test_min_tokens_and_eos(client):
    # Without ignore_eos the sim may stop early (EOS): finish_reason is then "stop",
    # never more tokens than max_tokens, never fewer than min_tokens.
    for seed in range(8):
        r = client.completions.create(model=MODEL, prompt="eos", max_tokens=50, seed=seed,
                                      extra_body={"min_tokens": 10})
        assert 10 <= r.usage.completion_tokens <= 50
        assert r.choices[0].finish_reason == ("length" if r.usage.completion_tokens == 50 else "stop")


def test_tokenize_with_requests_matches_usage(sim_server, client):
    """`/tokenize` and `/detokenize` at the root path (vLLM's shapes), with
    plain `requests`: the count is the completion's `usage.prompt_tokens`."""
    prompt = "The quick brown fox"
    r = requests.post(sim_server.base + "/tokenize", json={"model": MODEL, "prompt": prompt},
                      timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] > body["count"]
    usage = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1).usage
    assert body["count"] == usage.prompt_tokens
    plain = requests.post(sim_server.base + "/tokenize",
                          json={"prompt": prompt, "add_special_tokens": False}, timeout=30).json()
    r = requests.post(sim_server.base + "/detokenize", json={"tokens": plain["tokens"]}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": prompt}
    r = requests.post(sim_server.base + "/detokenize", json={"tokens": [-1]}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tokens"
