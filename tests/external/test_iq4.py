"""IQ4_XS and IQ4_NL GGUF weights (issue #36) against llama.cpp and gguf-py.

- The model crate's IQ4 tests check its dequantization against a fixture of
  gguf-py's (`crates/inferscope-model/tests/data/iq4_gguf_py.json`); here the
  script that wrote it runs again, so the fixture is gguf-py's output.
- A random-weight Llama GGUF (tiny_families.py) quantized to IQ4_XS and to
  IQ4_NL by llama.cpp's own quantizer, run by llama.cpp (the `llama_cpp`
  bindings) and by `inferscope serve --executor cpu`, the method of
  test_model_families.py for Q4_K_M: step by step on llama.cpp's greedy
  path, inferscope must pick llama.cpp's token wherever llama.cpp's top two
  logits are at least `MIN_MARGIN` apart; free-running, the two texts must
  agree up to the first step that is not that decisive.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from test_model_families import TOKENS, inferscope_steps, llama_cpp_greedy, mismatches
from tiny_families import quantize, tensor_types, write_family_gguf

REPO = Path(__file__).resolve().parents[2]
FIXTURE_SCRIPT = REPO / "crates/inferscope-model/tests/data/iq4_gguf_py.py"
# As for Q4_K_M (test_model_families.py): ~3x the two implementations'
# differences of quantized products, and how many of the 16 steps must
# be that decisive so that the test cannot pass vacuously.
MIN_MARGIN = 0.1
MIN_DECISIVE = 8
SEED = 0


def test_fixture_is_gguf_py_dequantization():
    spec = importlib.util.spec_from_file_location("iq4_gguf_py", FIXTURE_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.OUT.read_text() == script.text(), (
        "the checked-in fixture is not what gguf-py gives: rerun " + str(FIXTURE_SCRIPT))


@pytest.fixture(scope="module")
def llama_f16(workdir):
    return write_family_gguf(workdir / "tiny-llama-f16.gguf", "llama", SEED)


@pytest.mark.parametrize("ftype", ["IQ4_XS", "IQ4_NL"])
def test_same_greedy_tokens_as_llama_cpp(llama_f16, ftype, workdir):
    path = quantize(llama_f16, workdir / f"tiny-llama-{ftype.lower()}.gguf", ftype)
    types = tensor_types(path)
    layers = {t for n, t in types.items() if n.startswith("blk.") and not n.endswith("norm.weight")}
    # The file really holds the type (not a fallback) in every layer weight
    # but those llama.cpp's ftype keeps in other types.
    assert ftype in layers, types
    assert sum(t == ftype for t in types.values()) >= 10, types

    prompt, tokens, margins, texts = llama_cpp_greedy(path)
    assert len(set(tokens)) > 1, f"a degenerate model repeats one token: {tokens}"
    decisive = [m >= MIN_MARGIN for m in margins]
    assert sum(decisive) >= MIN_DECISIVE, (
        f"{ftype}: only {sum(decisive)} of llama.cpp's steps have their top two logits "
        f"{MIN_MARGIN} apart (margins {np.round(margins, 3).tolist()}): pick another SEED")

    got, steps = inferscope_steps(path, "tiny-llama", workdir, prompt, tokens)
    wrong = mismatches(steps, texts, margins, decisive)
    assert not wrong, f"{ftype}: (step, inferscope, llama.cpp, llama.cpp's margin) {wrong}"
    # Free-running: the same text as far as llama.cpp's steps are decisive.
    sure = decisive.index(False) if False in decisive else TOKENS
    want = "".join(texts[:sure])
    assert got.startswith(want), f"{ftype}: inferscope {got!r} vs llama.cpp {''.join(texts)!r}"
