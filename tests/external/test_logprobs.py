"""Log-probabilities through the official OpenAI client's types, and their
values against llama.cpp's server on the same F32 GGUF.

- The client parses every logprobs shape (completions and chat, streamed and
  not) into its own types with no field it does not define (`model_extra` is
  empty) and none of its required fields missing.
- On `tiny_gguf` (F32 weights), for 16 greedy steps, inferscope's values of
  llama.cpp's top-5 tokens and of the chosen token are within 1e-3 of
  llama.cpp's. llama-cpp-python's completions return `logprobs` as OpenAI's
  legacy object: `top_logprobs` per position is a map from the token's text
  to its log-softmax (of the raw logits) for the `logprobs` most likely plus
  the chosen token, so the two are compared per token text.
"""

from __future__ import annotations

import math

import openai
import pytest
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from openai.types.completion_choice import Logprobs

from conftest import MODEL, Server

PROMPT = "the people of the new time which was not"
STEPS = 16
TOP = 5
TOLERANCE = 1e-3


def exact(obj, cls) -> None:
    """`obj` is a `cls`, with no extra field and every required one."""
    assert isinstance(obj, cls), type(obj)
    assert not obj.model_extra, f"{cls.__name__}: extra fields {obj.model_extra}"
    required = {n for n, f in cls.model_fields.items() if f.is_required()}
    missing = required - obj.model_fields_set
    assert not missing, f"{cls.__name__}: missing {missing}"


def check_chat_logprobs(lp, top: int) -> None:
    exact(lp, ChoiceLogprobs)
    assert lp.content
    for e in lp.content:
        exact(e, ChatCompletionTokenLogprob)
        assert bytes(e.bytes) == e.token.encode()
        assert len(e.top_logprobs) == top
        for t in e.top_logprobs:
            exact(t, TopLogprob)


@pytest.fixture(scope="module")
def client(sim_server):
    return openai.OpenAI(base_url=sim_server.base + "/v1", api_key="unused", max_retries=0)


def test_completion_logprobs_parse_into_the_client_types(client):
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, seed=1, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    exact(lp, Logprobs)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(len(t) == 3 for t in lp.top_logprobs)
    streamed = []
    for chunk in client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, seed=1,
                                           logprobs=3, stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            exact(chunk.choices[0].logprobs, Logprobs)
            streamed += chunk.choices[0].logprobs.tokens
    assert streamed == lp.tokens
    # An evaluation harness's request: score the prompt, generate nothing.
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=0, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    exact(lp, Logprobs)
    assert r.choices[0].text == "Hello"
    assert lp.token_logprobs[0] is None and all(x < 0 for x in lp.token_logprobs[1:])


def test_chat_logprobs_parse_into_the_client_types(client):
    messages = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, seed=1,
                                       logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    check_chat_logprobs(r.choices[0].logprobs, 2)
    assert "".join(e.token for e in r.choices[0].logprobs.content) == r.choices[0].message.content
    streamed = []
    for chunk in client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, seed=1,
                                                logprobs=True, top_logprobs=2, stream=True,
                                                extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            lp = chunk.choices[0].logprobs
            exact(lp, openai.types.chat.chat_completion_chunk.ChoiceLogprobs)
            for e in lp.content:
                exact(e, ChatCompletionTokenLogprob)
            streamed += lp.content
    assert [e.token for e in streamed] == [e.token for e in r.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in r.choices[0].logprobs.content]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                       logprobs=True, top_logprobs=21)
    assert e.value.body["param"] == "top_logprobs"


def greedy_logprobs(base_url: str, model: str, **extra):
    c = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    r = c.completions.create(model=model, prompt=PROMPT, max_tokens=STEPS, temperature=0,
                             logprobs=TOP, extra_body={"ignore_eos": True, **extra})
    return r.choices[0].logprobs


def test_top5_logprobs_match_llama_cpp(tiny_gguf, llama_cpp_server, workdir):
    # llama-cpp-python's completions default to a repeat penalty of 1.1.
    theirs = greedy_logprobs(llama_cpp_server.base_url, llama_cpp_server.model, repeat_penalty=1.0)
    ours_server = Server([], workdir, model_args=["--executor", "cpu", "--model", str(tiny_gguf),
                                                  "--served-model-name", "tiny-llama"])
    try:
        ours = greedy_logprobs(ours_server.base, "tiny-llama")
    finally:
        ours_server.stop()
    # The same tokens, spelled two ways: llama.cpp's piece keeps SentencePiece's
    # leading space and gives "" for a partial UTF-8 byte; ours is the token
    # decoded alone, as vLLM's `tokenizer.decode([id])` ("power", U+FFFD).
    def norm(t):
        return t.lstrip(" ") if t else "\ufffd"

    assert [norm(t) for t in theirs.tokens[:STEPS]] == [norm(t) for t in ours.tokens[:STEPS]], (
        theirs.tokens, ours.tokens)
    worst, compared = 0.0, 0
    for step in range(STEPS):
        a, b = theirs.top_logprobs[step], ours.top_logprobs[step]

        def unique(d):
            # Spellings that name one token only: byte tokens all read "" in
            # llama.cpp's map (and U+FFFD in ours), so they collide and drop out.
            keys = [norm(k) for k in d]
            return {norm(k): v for k, v in d.items()
                    if keys.count(norm(k)) == 1 and norm(k) != "\ufffd"}

        ua, ub = unique(a), unique(b)
        for text in sorted(ua, key=ua.get, reverse=True)[:TOP]:
            if text in ub:
                worst = max(worst, abs(ua[text] - ub[text]))
                compared += 1
        worst = max(worst, abs(theirs.token_logprobs[step] - ours.token_logprobs[step]))
        assert math.isfinite(ours.token_logprobs[step])
    # Most of the top-5 entries are printable, distinct tokens.
    assert compared >= STEPS * TOP // 2, f"only {compared} entries comparable"
    assert worst <= TOLERANCE, f"largest difference {worst}"
    print(f"largest |inferscope - llama.cpp| over {STEPS} steps, {compared} top-{TOP} entries and the chosen tokens: {worst:.2e}")
