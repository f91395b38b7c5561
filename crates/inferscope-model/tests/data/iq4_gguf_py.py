"""Writes iq4_gguf_py.json: fixed IQ4_NL and IQ4_XS blocks and gguf-py's
dequantization of them (`gguf.quants.dequantize`), the reference the model
crate's IQ4 tests check against. Run with the external suite's Python:

    /work/venv-ext/bin/python crates/inferscope-model/tests/data/iq4_gguf_py.py

tests/external/test_iq4.py checks that the checked-in file is what this writes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

OUT = Path(__file__).with_name("iq4_gguf_py.json")


def blocks(kind: GGMLQuantizationType, n: int, rng: np.random.Generator) -> np.ndarray:
    """`n` blocks of random bytes (every index, scale bit and nibble varies)
    with finite scales `d` of varied magnitude and sign."""
    size = {GGMLQuantizationType.IQ4_NL: 18, GGMLQuantizationType.IQ4_XS: 136}[kind]
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    d = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 1, n)).astype(np.float16)
    b[:, :2] = d.view(np.uint8).reshape(n, 2)
    return b


def fixture() -> dict:
    rng = np.random.default_rng(36)
    out = {}
    for kind, n in [(GGMLQuantizationType.IQ4_NL, 8), (GGMLQuantizationType.IQ4_XS, 4)]:
        b = blocks(kind, n, rng)
        values = dequantize(b.reshape(-1), kind).reshape(-1).astype(np.float32)
        out[kind.name] = {"blocks": b.tobytes().hex(),
                          "values": [float(v) for v in values]}
    return out


def text() -> str:
    return json.dumps(fixture(), indent=0) + "\n"


if __name__ == "__main__":
    OUT.write_text(text())
    print(OUT, file=sys.stderr)
