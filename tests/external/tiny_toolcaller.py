"""A tiny Llama GGUF that writes a Hermes tool call: a model whose greedy
output is fixed by its weights, so that a test sees the server parse a
`<tool_call>` block the model itself wrote (the demo model never writes one).

The layers add nothing (their output projections are zero), so the logits
depend only on the last token: a bigram table in the embeddings and the
head. After the prompt's last token (`\\n`, which ends the chat template's
`<|im_start|>assistant\\n`) the most likely token opens the call; the next
most likely one starts a plain answer, which a client gets by banning the
call's opening token with `logit_bias`. The file is otherwise tiny_gguf.py's:
llama's tensor names and metadata, its SentencePiece vocabulary plus the
pieces written here, and a Qwen 2.5-style chat template with tools.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

import tiny_gguf
from tiny_gguf import HIDDEN, vocabulary

# What the model writes: a call to get_weather for Paris, in pieces (spaces
# as SentencePiece's ▁), and the answer it gives instead when the call is banned.
CALL_PIECES = ["<tool_call>", '{"name":\u2581"get_weather",', '\u2581"arguments":\u2581{"city":',
               '\u2581"Par', 'is"}}', "</tool_call>"]
ANSWER_PIECES = ["It\u2581is\u2581sunny", "\u2581in\u2581Paris."]
CALL_TEXT = "".join(CALL_PIECES).replace("\u2581", " ")
# The same call as `--tool-call-parser pythonic` reads it (Llama 3.2/4).
PYTHONIC_PIECES = ["[get_weather(", 'city="Par', 'is",\u2581days=3)]']
PYTHONIC_TEXT = "".join(PYTHONIC_PIECES).replace("\u2581", " ")
ANSWER_TEXT = "".join(ANSWER_PIECES).replace("\u2581", " ")

CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def toolcaller_vocabulary(call_pieces: list[str]) -> tuple[list[str], list[float], list[int]]:
    """tiny_gguf's vocabulary with the call's and the answer's pieces added."""
    tokens, scores, types = vocabulary()
    for p in call_pieces + ANSWER_PIECES:
        assert p not in tokens, p
        tokens.append(p)
        scores.append(-1000.0)
        types.append(int(gguf.TokenType.NORMAL))
    return tokens, scores, types


def write_toolcaller(path: Path, call_pieces: list[str] = CALL_PIECES
                     ) -> tuple[Path, dict[str, int]]:
    """Writes the model (writing the call in `call_pieces`); returns its
    path and the ids of its pieces."""
    tokens, scores, types = toolcaller_vocabulary(call_pieces)
    ids = {t: i for i, t in enumerate(tokens)}
    vocab = len(tokens)
    newline, eos = ids["<0x0A>"], 2
    # The bigram table: token -> [(next token, logit)].
    chain = [newline, *(ids[p] for p in call_pieces), eos]
    answer = [newline, *(ids[p] for p in ANSWER_PIECES), eos]
    table: dict[int, list[tuple[int, float]]] = {}
    for seq, logit in ((chain, 20.0), (answer, 10.0)):
        for a, b in zip(seq, seq[1:]):
            table.setdefault(a, []).append((b, logit))
    # One embedding dimension per token that has a successor; RMSNorm turns
    # the one-hot 1 into sqrt(HIDDEN).
    dim = {t: d for d, t in enumerate(sorted(table))}
    assert len(dim) <= HIDDEN
    embd = np.zeros((vocab, HIDDEN), dtype=np.float32)
    head = np.zeros((vocab, HIDDEN), dtype=np.float32)
    scale = np.sqrt(HIDDEN)
    for t, d in dim.items():
        embd[t, d] = 1.0
        for nxt, logit in table[t]:
            head[nxt, d] = logit / scale

    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    # Zero output projections: the layers leave the residual stream as it is.
    tiny_gguf.write_llama(path, "inferscope-tiny-toolcaller", (tokens, scores, types), w,
                          embd=embd, output=head, residual_only=True, eos=eos,
                          chat_template=CHAT_TEMPLATE)
    return path, ids
