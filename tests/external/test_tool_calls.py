"""Tool calling with the official OpenAI client against `inferscope serve
--enable-auto-tool-choice --tool-call-parser hermes` (and `pythonic`), on a
tiny model whose weights make it write a `<tool_call>` block (or a Python
call list) (tiny_toolcaller.py): the server
reads the call the model wrote into `tool_calls`, streamed and not (the
client's own stream accumulation rebuilds it), and after the client sends
the tool's result back (role `tool`), the model answers in text.
"""

from __future__ import annotations

import json

import openai
import pytest

from conftest import MODEL, Server
from tiny_toolcaller import (ANSWER_TEXT, CALL_TEXT, PYTHONIC_PIECES, PYTHONIC_TEXT,
                             write_toolcaller)

NAME = "toolcaller"
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def toolcaller(workdir):
    path, ids = write_toolcaller(workdir / "toolcaller.gguf")
    server = Server(["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], workdir,
                    model_args=["--executor", "cpu", "--model", str(path),
                                "--served-model-name", NAME])
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    yield client, ids
    server.stop()


def test_the_model_writes_the_call(toolcaller):
    """The model's raw text is the call (tool_choice none: nothing parsed),
    so what the next tests parse is what the model wrote."""
    client, _ = toolcaller
    r = client.chat.completions.create(model=NAME, messages=QUESTION, tools=TOOLS,
                                       tool_choice="none", temperature=0, max_tokens=20)
    assert r.choices[0].message.content == CALL_TEXT
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"


def test_auto_hermes_parses_the_written_call(toolcaller):
    client, _ = toolcaller
    r = client.chat.completions.create(model=NAME, messages=QUESTION, tools=TOOLS,
                                       tool_choice="auto", temperature=0, max_tokens=20)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.function.arguments == '{"city": "Paris"}'


def test_streamed_call_accumulates_in_the_client(toolcaller):
    """The client's stream helper accumulates the deltas into the same call."""
    client, _ = toolcaller
    with client.chat.completions.stream(model=NAME, messages=QUESTION, tools=TOOLS,
                                        temperature=0, max_tokens=20) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris"}'
    assert call.id.startswith("chatcmpl-tool-")
    # OpenAI's delta shape: the name (with id and type) first, then
    # argument fragments; no content.
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id == call.id
    assert deltas[0].type == "function"
    fragments = [d.function.arguments for d in deltas[1:]]
    assert len(fragments) >= 2 and all(d.id is None and d.function.name is None
                                       for d in deltas[1:]), deltas
    assert "".join([deltas[0].function.arguments or "", *fragments]) == '{"city": "Paris"}'
    assert all(not ch.delta.content for c in chunks for ch in c.choices)


def test_round_trip_with_the_tool_result(toolcaller):
    """The call, then its result sent back as a `tool` message: the model
    answers in text (the client bans the call's opening token, so the model
    takes its next most likely path)."""
    client, ids = toolcaller
    first = client.chat.completions.create(model=NAME, messages=QUESTION, tools=TOOLS,
                                           temperature=0, max_tokens=20)
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *QUESTION,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny"})},
    ]
    r = client.chat.completions.create(model=NAME, messages=messages, tools=TOOLS,
                                       temperature=0, max_tokens=20,
                                       logit_bias={str(ids["<tool_call>"]): -100})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == ANSWER_TEXT
    assert r.choices[0].message.tool_calls is None
    # The conversation, tool result included, reached the template.
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 10


def test_auto_without_the_flag_is_a_400(make_server):
    server = make_server(["--sim-profile", "tiny"])
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=QUESTION, tools=TOOLS,
                                       tool_choice="auto", max_tokens=4)
    assert e.value.body["param"] == "tool_choice"


@pytest.fixture(scope="module")
def pythonic(workdir):
    path, _ = write_toolcaller(workdir / "pythonic.gguf", PYTHONIC_PIECES)
    server = Server(["--enable-auto-tool-choice", "--tool-call-parser", "pythonic"], workdir,
                    model_args=["--executor", "cpu", "--model", str(path),
                                "--served-model-name", NAME])
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    yield client
    server.stop()


def test_pythonic_parses_the_written_call_list(pythonic):
    """`[get_weather(city="Paris", days=3)]` as the model wrote it becomes a
    call with JSON arguments, streamed (accumulated by the client) and not."""
    raw = pythonic.chat.completions.create(model=NAME, messages=QUESTION, tools=TOOLS,
                                           tool_choice="none", temperature=0, max_tokens=20)
    assert raw.choices[0].message.content == PYTHONIC_TEXT
    r = pythonic.chat.completions.create(model=NAME, messages=QUESTION, tools=TOOLS,
                                         temperature=0, max_tokens=20)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    assert call.function.arguments == '{"city": "Paris", "days": 3}'
    with pythonic.chat.completions.stream(model=NAME, messages=QUESTION, tools=TOOLS,
                                          temperature=0, max_tokens=20) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert (streamed.function.name, streamed.function.arguments) == \
        ("get_weather", '{"city": "Paris", "days": 3}')
    deltas = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].type == "function"
    assert len(deltas) >= 3 and all(d.function.name is None for d in deltas[1:]), deltas
    assert all(not ch.delta.content for c in chunks for ch in c.choices)
