"""Structured outputs through the official OpenAI Python client.

`client.chat.completions.parse(response_format=PydanticModel)` against the
built-in demo model (a real 2.4M-parameter transformer on the cpu executor,
whose free text is never JSON) returns a parsed object that validates, for
20 seeds: decoding is constrained by the schema the client derives from the
model. `json_object`, regex and choice are checked the same way.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, List

import openai
import pytest
from pydantic import BaseModel, Field


DEMO = "demo"


class Character(BaseModel):
    """Bounded string and list lengths: every output ends within max_tokens."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=99)
    traits: List[Annotated[str, Field(max_length=12)]] = Field(max_length=3)
    married: bool


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=demo_server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("seed", range(20))
def test_parse_returns_a_validating_object(client, seed):
    completion = client.chat.completions.parse(
        model=DEMO,
        messages=[{"role": "user", "content": "Describe Mr. Darcy."}],
        response_format=Character,
        max_tokens=200,
        temperature=1.0,
        seed=seed,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    parsed = choice.message.parsed
    assert isinstance(parsed, Character), choice.message.content
    # The client validated it; check the bounds again on the object.
    assert len(parsed.name) <= 12 and 0 <= parsed.age <= 99 and len(parsed.traits) <= 3


@pytest.mark.parametrize("seed", range(10))
def test_json_object_starts_an_object_and_parses_when_finished(client, seed):
    r = client.chat.completions.create(
        model=DEMO,
        messages=[{"role": "user", "content": "Elizabeth as JSON"}],
        response_format={"type": "json_object"},
        max_tokens=48,
        seed=seed,
    )
    text = r.choices[0].message.content
    assert text.startswith("{"), text
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict), text


@pytest.mark.parametrize("seed", range(5))
def test_regex_and_choice(client, seed):
    r = client.completions.create(
        model=DEMO, prompt="The date was", max_tokens=20, seed=seed,
        extra_body={"structured_outputs": {"regex": r"[0-9]{1,2} (May|June) 18[0-9]{2}"}},
    )
    text = r.choices[0].text
    assert re.fullmatch(r"[0-9]{1,2} (May|June) 18[0-9]{2}", text), text
    assert r.choices[0].finish_reason == "stop"
    r = client.chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": "Will she dance?"}], max_tokens=8,
        seed=seed, extra_body={"guided_choice": ["yes", "no", "perhaps"]},
    )
    assert r.choices[0].message.content in ("yes", "no", "perhaps")


def test_invalid_schema_is_a_bad_request_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": 3}}}}},
        )
    assert e.value.status_code == 400
    assert e.value.body.get("param") == "response_format"
    assert "JSON schema" in e.value.body.get("message", "")


# vLLM's structural tag, original form: wherever the trigger `e` appears in
# the free text, a tag follows: `e`, a JSON integer, `;`.
LEGACY_TAG = {"type": "structural_tag",
              "structures": [{"begin": "e", "schema": {"type": "integer"}, "end": ";"}],
              "triggers": ["e"]}


def test_structural_tag_constrains_text_after_each_trigger(client):
    triggered = 0
    for seed in range(6):
        r = client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=40,
            temperature=1.0, seed=seed,
            extra_body={"structured_outputs": {"structural_tag": json.dumps(LEGACY_TAG)}},
        )
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        after = text.split("e")[1:]
        triggered += len(after)
        for i, part in enumerate(after):
            if finish == "length" and i == len(after) - 1:
                assert re.fullmatch(r"(-?[0-9]*(;[^e]*)?)?", part), text
            else:
                assert re.fullmatch(r"-?(0|[1-9][0-9]*);[^e]*", part), text
    assert triggered > 0, "the free text never wrote the trigger"


def test_structural_tag_newer_format_in_response_format(client):
    """The newer form (`format`): a tag whose content is a JSON schema, the
    whole output; sent as vLLM's `response_format` type `structural_tag`."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
              "required": ["city"], "additionalProperties": False}
    tag = {"type": "structural_tag",
           "format": {"type": "tag", "begin": "<function=get_weather>",
                      "content": {"type": "json_schema", "json_schema": schema},
                      "end": "</function>"}}
    r = client.chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": "Weather?"}], max_tokens=60, seed=1,
        response_format=tag,
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    m = re.fullmatch(r"<function=get_weather>(.*)</function>", text)
    assert m, text
    assert set(json.loads(m.group(1))) == {"city"}, text


def test_invalid_structural_tag_is_a_bad_request(client):
    bad = {"type": "structural_tag",
           "structures": [{"begin": "<a>", "schema": {"type": "object"}, "end": "</a>"}],
           "triggers": ["<b"]}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "x"}], max_tokens=4,
            response_format=bad,
        )
    assert e.value.body.get("param") == "response_format"
    assert "structural tag" in e.value.body["message"], e.value.body
    assert "does not start with any of the triggers" in e.value.body["message"], e.value.body
