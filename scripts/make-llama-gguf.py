#!/usr/bin/env python3
"""Writes a random-weight Llama GGUF (llama.cpp layout, SentencePiece-style
vocabulary in the metadata) for benchmarks of the cpu executor, with the
layer weights (and output head) in F32, F16 or Q8_0:

    /work/main/.venv-external/bin/python scripts/make-llama-gguf.py OUT.gguf --type q8_0

Defaults: the ~88M-parameter config of issue #18 (hidden 768, 12 layers,
12 query / 4 KV heads, MLP 2048, vocab 32000). Needs `numpy` and `gguf`
(both in tests/external's venv). The weights are N(0, 0.02): the text is
meaningless; the products cost what a real model's do."""
import argparse
import itertools
import string

import numpy as np
import gguf

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("out")
p.add_argument("--type", choices=["f32", "f16", "q8_0"], default="q8_0")
p.add_argument("--hidden", type=int, default=768)
p.add_argument("--layers", type=int, default=12)
p.add_argument("--heads", type=int, default=12)
p.add_argument("--kv-heads", type=int, default=4)
p.add_argument("--ffn", type=int, default=2048)
p.add_argument("--vocab", type=int, default=32000)
p.add_argument("--seed", type=int, default=0)
a = p.parse_args()

# <unk> <s> </s>, 256 byte tokens, then letters and their pairs/triples
# with and without the word marker: every multi-letter piece splits into
# two pieces of the vocabulary, so SentencePiece-style merges exist.
tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
types = [2, 3, 3] + [6] * 256
letters = string.ascii_lowercase
pieces = ["\u2581"] + list(letters) + ["\u2581" + c for c in letters]
for n in (2, 3):
    for t in itertools.product(letters, repeat=n):
        pieces += ["".join(t), "\u2581" + "".join(t)]
pieces = pieces[: a.vocab - len(tokens)]
if len(tokens) + len(pieces) < a.vocab:
    raise SystemExit(f"--vocab {a.vocab} is larger than this script's {len(tokens) + len(pieces)} pieces")
scores = [0.0] * len(tokens) + [-float(len(s)) - i * 1e-6 for i, s in enumerate(pieces)]
tokens += pieces
types += [1] * len(pieces)

head_dim = a.hidden // a.heads
w = gguf.GGUFWriter(a.out, "llama")
w.add_context_length(4096)
w.add_embedding_length(a.hidden)
w.add_block_count(a.layers)
w.add_feed_forward_length(a.ffn)
w.add_head_count(a.heads)
w.add_head_count_kv(a.kv_heads)
w.add_rope_dimension_count(head_dim)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_freq_base(10000.0)
w.add_vocab_size(a.vocab)
w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[a.type])
w.add_tokenizer_model("llama")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)

rng = np.random.default_rng(a.seed)
qtype = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
}[a.type]


def put(name, shape, quantize):
    data = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    if name.endswith("_norm.weight"):
        data = np.ones(shape, dtype=np.float32)
    if not quantize or qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, data)
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, data.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


h, f, v = a.hidden, a.ffn, a.vocab
kv = a.kv_heads * head_dim
# The embedding table stays F32 (it is read per token, not multiplied).
put("token_embd.weight", (v, h), False)
put("output_norm.weight", (h,), False)
put("output.weight", (v, h), True)
for l in range(a.layers):
    put(f"blk.{l}.attn_norm.weight", (h,), False)
    put(f"blk.{l}.ffn_norm.weight", (h,), False)
    put(f"blk.{l}.attn_q.weight", (h, h), True)
    put(f"blk.{l}.attn_k.weight", (kv, h), True)
    put(f"blk.{l}.attn_v.weight", (kv, h), True)
    put(f"blk.{l}.attn_output.weight", (h, h), True)
    put(f"blk.{l}.ffn_gate.weight", (f, h), True)
    put(f"blk.{l}.ffn_up.weight", (f, h), True)
    put(f"blk.{l}.ffn_down.weight", (h, f), True)

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
params = v * h * 2 + a.layers * (2 * h * h + 2 * kv * h + 3 * h * f)
print(f"{a.out}: {a.type}, {params / 1e6:.0f}M parameters")
