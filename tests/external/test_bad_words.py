"""vLLM's `bad_words` through the official OpenAI Python client (`extra_body`)
against the built-in demo model on the cpu executor, greedily.

A word of two tokens that the greedy text holds mid-text (so banned the way
vLLM tokenizes it, with a leading space; the demo model's words are one token
each, so the "word" is two of them) still comes out as its first token,
then something else; a one-token word never comes out; bad values are a 400
naming `bad_words`.
"""

from __future__ import annotations

import openai
import pytest
import requests


DEMO = "demo"
PROMPT = "It is a truth universally acknowledged"


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=demo_server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def tokens(client, **extra) -> list[str]:
    """The greedy completion's tokens, as texts (`logprobs: 0`)."""
    r = client.completions.create(model=DEMO, prompt=PROMPT, max_tokens=32, temperature=0,
                                  logprobs=0, extra_body=extra or None)
    return r.choices[0].logprobs.tokens


def tokenize(server, text: str) -> list[int]:
    r = requests.post(server.base + "/tokenize", json={"prompt": text, "add_special_tokens": False},
                      timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def detokenize(server, ids: list[int]) -> str:
    r = requests.post(server.base + "/detokenize", json={"tokens": ids}, timeout=30)
    r.raise_for_status()
    return r.json()["prompt"]


def two_token_word(server, toks: list[str]) -> tuple[int, str]:
    """The first word of the output made of tokens i, i + 1 that vLLM's rule
    bans as they stand: its spaced form is those two tokens, and its plain
    form as many tokens starting with another one."""
    for i, (x, y) in enumerate(zip(toks, toks[1:])):
        if not x.startswith(" ") or not x.strip() or not y.strip():
            continue
        word = x.lstrip() + y
        plain, spaced = tokenize(server, word), tokenize(server, " " + word)
        if (len(plain) == len(spaced) == 2 and plain[0] != spaced[0]
                and [detokenize(server, [t]) for t in spaced] == [x, y]):
            return i, word
    raise AssertionError(f"no two-token word in {toks}")


def test_a_banned_word_is_never_generated(client, demo_server):
    greedy = tokens(client)
    i, word = two_token_word(demo_server, greedy)
    banned = tokens(client, bad_words=[word])
    assert banned[:i + 1] == greedy[:i + 1], (banned, greedy)
    assert banned[i + 1] != greedy[i + 1], banned
    assert [greedy[i], greedy[i + 1]] not in [banned[k:k + 2] for k in range(len(banned) - 1)]
    # Its first token alone, through chat: never generated.
    single = tokens(client, bad_words=[greedy[i].lstrip()])
    assert greedy[i] not in single, single
    r = client.chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": PROMPT}], max_tokens=24, temperature=0,
        logprobs=True, extra_body={"bad_words": [greedy[i].lstrip()]})
    assert greedy[i] not in [t.token for t in r.choices[0].logprobs.content]


@pytest.mark.parametrize("value", ["word", [1], [""], ["ok", None]])
def test_bad_values_are_bad_requests(client, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=DEMO, prompt="x", max_tokens=2, extra_body={"bad_words": value})
    assert e.value.status_code == 400
    assert e.value.body.get("param") == "bad_words"
