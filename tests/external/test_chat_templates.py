"""Chat templates rendered by inferscope exactly as transformers renders them.

Each of llama.cpp's real chat templates (`$INFERSCOPE_LLAMA_CPP_MODELS/templates/*.jinja`,
from the llama-cpp-python sdist) renders a fixed set of conversations twice: with
Python's jinja2 set up as transformers' `apply_chat_template` sets it up (the reference
below), and with `inferscope chat-template`. The outputs must be byte-identical; a
conversation on which both raise (many templates refuse a system message, or want
alternating roles) agrees too. Templates listed in EXCLUDED are reported with their
reason and must still disagree (so the list cannot go stale).

Skipped when INFERSCOPE_LLAMA_CPP_MODELS is not set (.ci/run sets it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from conftest import INFERSCOPE_BIN

MODELS = os.environ.get("INFERSCOPE_LLAMA_CPP_MODELS")


@contextlib.contextmanager
def utc_clock():
    """Both renderers read the clock for `strftime_now`: inferscope in UTC, so the
    reference's `datetime.now()` runs in UTC too, for the test's duration only."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def transformers_environment(source: str) -> jinja2.Template:
    """The template compiled as transformers' `_compile_jinja_template` compiles it
    (`utils/chat_template_utils.py`); its `AssistantTracker` extension only adds the
    `{% generation %}` tag, which no template here uses."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def render_reference(source: str, messages: list, add_generation_prompt: bool,
                     bos: str, eos: str) -> tuple[bool, str]:
    """(True, text), or (False, the error) when the template raises."""
    try:
        template = transformers_environment(source)
        # What `render_jinja_template` passes: tools and documents are None without them,
        # then the tokenizer's special tokens.
        return True, template.render(messages=messages, tools=None, documents=None,
                                     add_generation_prompt=add_generation_prompt,
                                     bos_token=bos, eos_token=eos)
    except Exception as e:  # noqa: BLE001 - any failure of the template counts as raising
        return False, f"{type(e).__name__}: {e}"


def render_inferscope(template: Path, messages_file: Path, add_generation_prompt: bool,
                      bos: str, eos: str) -> tuple[bool, str]:
    cmd = [str(INFERSCOPE_BIN), "chat-template", "--chat-template", str(template),
           "--messages", str(messages_file), "--bos-token", bos, "--eos-token", eos]
    if not add_generation_prompt:
        cmd.append("--no-generation-prompt")
    p = subprocess.run(cmd, capture_output=True, timeout=60)
    if p.returncode == 0:
        return True, p.stdout.decode("utf-8")
    stderr = p.stderr.decode("utf-8", "replace").strip()
    assert "panicked" not in stderr, f"inferscope panicked on {template.name}: {stderr}"
    return False, stderr


SYSTEM = {"role": "system", "content": "You are a helpful assistant. Réponds brièvement."}
USER_1 = {"role": "user", "content": "What is 2+2? Say it \"plainly\" & <b>briefly</b>, s'il te plaît 🙂"}
ASSISTANT = {"role": "assistant", "content": "2 + 2 = 4."}
USER_2 = {"role": "user", "content": "  And 3+3?\n  "}
# Reasoning templates cut the thinking out of earlier assistant turns with Python's
# string methods (split, strip, rstrip('\n')).
THINKING = {"role": "assistant", "content": "<think>\nAdd: 2 + 2.\n</think>\n\n4 — easy."}

# (name, messages); each renders with and without add_generation_prompt.
CONVERSATIONS = [
    ("system+user+assistant+user", [SYSTEM, USER_1, ASSISTANT, USER_2]),
    ("user+assistant+user", [USER_1, ASSISTANT, USER_2]),
    ("user", [USER_1]),
    ("user+thinking assistant+user", [USER_1, THINKING, USER_2]),
]

# The special-token strings of each template's model (the same on both sides); the
# default is SentencePiece's.
SPECIAL_TOKENS = [
    ("Llama-3", ("<|begin_of_text|>", "<|eot_id|>")),
    ("Hermes-2-Pro-Llama-3", ("<|begin_of_text|>", "<|im_end|>")),
    ("Hermes-3-Llama-3.1", ("<|begin_of_text|>", "<|im_end|>")),
    ("firefunction", ("<|begin_of_text|>", "<|eot_id|>")),
    ("functionary", ("<|begin_of_text|>", "<|eot_id|>")),
    ("Qwen", ("", "<|im_end|>")),
    ("SmolLM3", ("", "<|im_end|>")),
    ("DeepSeek", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("deepseek", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")),
    ("gemma", ("<bos>", "<eos>")),
    ("gpt-oss", ("<|startoftext|>", "<|return|>")),
    ("Phi-3", ("<s>", "<|end|>")),
    ("granite", ("<|end_of_text|>", "<|end_of_text|>")),
    ("GLM", ("", "<|user|>")),
]


def special_tokens(name: str) -> tuple[str, str]:
    for key, tokens in SPECIAL_TOKENS:
        if key in name:
            return tokens
    return "<s>", "</s>"


# Templates the comparison leaves out, with the reason. Each must still disagree.
TOOLS_NONE = ("a tool-use template: it loops over `tools` unconditionally, which transformers "
              "passes as None without tools; Python raises TypeError ('NoneType' object is not "
              "iterable) where minijinja loops over none as over an empty list")
EXCLUDED: dict[str, str] = {
    "CohereForAI-c4ai-command-r-plus-tool_use": TOOLS_NONE,
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": TOOLS_NONE,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": TOOLS_NONE,
}


def templates() -> list[Path]:
    return sorted((Path(MODELS) / "templates").glob("*.jinja")) if MODELS else []


@pytest.mark.skipif(not MODELS, reason="INFERSCOPE_LLAMA_CPP_MODELS is not set: no llama.cpp templates")
def test_real_chat_templates_render_as_transformers_renders_them():
    found = templates()
    assert len(found) >= 60, f"expected ~70 templates in {MODELS}/templates, found {len(found)}"
    disagreements: dict[str, list[str]] = {}
    both_raise = 0
    cases = 0
    with tempfile.TemporaryDirectory() as tmp, utc_clock():
        files = {}
        for name, messages in CONVERSATIONS:
            files[name] = Path(tmp) / f"{name}.json"
            files[name].write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
        for template in found:
            source = template.read_text(encoding="utf-8")
            bos, eos = special_tokens(template.stem)
            for name, messages in CONVERSATIONS:
                for agp in (True, False):
                    cases += 1
                    want = render_reference(source, messages, agp, bos, eos)
                    got = render_inferscope(template, files[name], agp, bos, eos)
                    if not want[0] and not got[0]:
                        both_raise += 1
                        continue
                    if want != got:
                        disagreements.setdefault(template.stem, []).append(
                            f"{name}, add_generation_prompt={agp}:\n"
                            f"  transformers: {want[1][:600]!r}\n  inferscope:   {got[1][:600]!r}")
    checked = [t.stem for t in found if t.stem not in EXCLUDED]
    print(f"\nchat templates: {len(found)} found, {len(checked)} checked, {len(EXCLUDED)} excluded; "
          f"{cases} renderings, {both_raise} raised in both renderers")
    for name, reason in sorted(EXCLUDED.items()):
        print(f"  excluded {name}: {reason}")
    unexpected = {k: v for k, v in disagreements.items() if k not in EXCLUDED}
    stale = [k for k in EXCLUDED if k not in disagreements and k in {t.stem for t in found}]
    report = "\n".join(f"{k}:\n" + "\n".join(v) for k, v in sorted(unexpected.items()))
    assert not unexpected, f"{len(unexpected)} templates render differently:\n{report}"
    assert not stale, f"excluded templates that now agree (remove them from EXCLUDED): {stale}"
