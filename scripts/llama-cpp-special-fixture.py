#!/usr/bin/env python3
"""Writes what llama.cpp itself (the llama-cpp-python bindings) gives for the
ggml-vocab-*.gguf files of llama.cpp's test material, where its own .inp/.out
tests do not look: prompts with special tokens in them tokenized as its server
does (add_special=True, parse_special=True), and the end-of-generation set.

    /work/venv-ext/bin/python scripts/llama-cpp-special-fixture.py \
        "$(scripts/llama-cpp-test-data.sh)" > crates/inferscope-model/tests/data/llama_cpp_special.json

The prompts are built from each vocabulary's own control and user-defined
tokens (read with the gguf package), around text, spaces and newlines.
"""
import json
import os
import sys

import gguf
import llama_cpp

DIR = sys.argv[1]
FILES = [
    "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
    "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder",
]


def specials(path):
    r = gguf.GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"]
    types = r.fields.get("tokenizer.ggml.token_type")
    out = []
    for i, idx in enumerate(toks.data):
        t = bytes(toks.parts[idx]).decode("utf-8", "replace")
        ty = int(types.parts[types.data[i]][0]) if types else 1
        if ty in (3, 4) and t:
            out.append((i, t))
    return out


def prompts(sp):
    # Up to 6 special tokens: the first ones by id and the longest ones.
    chosen = []
    for _, t in sp[:3] + sorted(sp, key=lambda x: -len(x[1]))[:3]:
        if t not in chosen:
            chosen.append(t)
    a = chosen[0] if chosen else "<s>"
    b = chosen[-1] if chosen else "</s>"
    out = [
        "Hello world",
        " leading space and trailing ",
        f"{a}Hello{b}",
        f"{a} spaced {b} words \n\n next",
        f"{b}{b}{a}",
        f"x{a}\n{b}  y",
        # Non-ASCII whitespace beside punctuation and letters.
        "a!\u3000! b\u00a0c\u2003 d\u3000\u3000",
    ]
    for t in chosen:
        out.append(f"user: {t} tell me\n{t}")
    return out


def main():
    res = {}
    for name in FILES:
        path = os.path.join(DIR, f"ggml-vocab-{name}.gguf")
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        cases = []
        for p in prompts(specials(path)):
            ids = llm.tokenize(p.encode(), add_bos=True, special=True)
            cases.append({"text": p, "ids": ids})
        res[f"ggml-vocab-{name}.gguf"] = {"eog": eog, "server_prompts": cases}
    json.dump({"llama_cpp_python": llama_cpp.__version__, "vocabs": res}, sys.stdout, indent=1, ensure_ascii=False)
    print()


main()
