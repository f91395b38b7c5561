#!/usr/bin/env python3
"""inferscope's logits against llama.cpp's on the tiny random-weight GGUFs of
tests/external/tiny_families.py, in F16 and llama.cpp's own Q4_K_M:

    INFERSCOPE_BIN=target/debug/inferscope /work/venv-ext/bin/python \\
        scripts/llamacpp-logits.py families --archs llama,qwen3 --types f16,q4_k_m
    /work/venv-ext/bin/python scripts/llamacpp-logits.py sensitivity

`families`: per family and type, llama.cpp's 16 greedy tokens after the
prompt (prompt in one batch, then token by token, as
test_model_families.py), then inferscope's logits at every position of the
prompt and those tokens (`prompt_logprobs` over the whole vocabulary);
prints the largest logit difference (both centred, as log-probabilities
differ by a constant per position), the largest difference of llama.cpp's
top-two margin as the two measure it, and at how many of the 16 steps
inferscope's top token is llama.cpp's.

`sensitivity`: the Llama file in Q4_K_M run by a float64 numpy forward pass
of its dequantized weights (no inferscope, no llama.cpp arithmetic), with
and without each product's activations rounded as llama.cpp's
`quantize_row_q8_K` does, and again with the token embeddings perturbed by
a relative 1e-7..1e-4: how far a float difference before the 8-bit
rounding moves the logits. Also llama.cpp against itself (the prompt in
one batch or token by token). Needs numpy, gguf and llama_cpp (the
external suite's venv)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/external"))
from tiny_families import quantize_q4_k_m, write_family_gguf  # noqa: E402

import llama_cpp  # noqa: E402

PROMPT = b"the people of the new time which was not"
STEPS = 16


def centred(a):
    return a - a.mean(-1, keepdims=True)


def rel(a, b):
    """Max |a - b| over max |b|, both centred."""
    return np.abs(centred(a) - centred(b)).max() / np.abs(centred(b)).max()


def llama_cpp_run(path, steps=STEPS, batch=512, threads=2):
    """llama.cpp's prompt tokens + its greedy tokens, and its logits at each."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=threads, n_batch=batch,
                          n_ubatch=batch, verbose=False, logits_all=True)
    toks = llm.tokenize(PROMPT, add_bos=True)
    n0 = len(toks)
    if batch == 1:
        for t in toks:
            llm.eval([t])
    else:
        llm.eval(toks)
    for _ in range(steps):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        toks.append(t)
        llm.eval([t])
    return toks, np.array(llm.scores[:len(toks)], dtype=np.float64), n0


def inferscope_logits(path, toks, vocab):
    """`inferscope serve --executor cpu`'s log-probabilities of the whole
    vocabulary after each prefix of `toks`."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_ = os.environ.get("INFERSCOPE_BIN", str(REPO / "target/debug/inferscope"))
    log = tempfile.TemporaryFile()
    p = subprocess.Popen([bin_, "serve", "--executor", "cpu", "--model", str(path),
                          "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
                          "--max-logprobs", str(vocab)], stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health")
                break
            except OSError:
                time.sleep(0.5)
        # One more token, so that the last position's distribution is a
        # prompt position too.
        body = json.dumps({"model": "m", "prompt": toks + [toks[1]], "max_tokens": 1,
                           "temperature": 0, "prompt_logprobs": vocab}).encode()
        req = urllib.request.Request(base + "/v1/completions", body,
                                     {"Content-Type": "application/json"})
        r = json.load(urllib.request.urlopen(req))
    finally:
        p.terminate()
        p.wait()
    out = np.full((len(toks), vocab), np.nan)
    for i, pos in enumerate(r["choices"][0]["prompt_logprobs"][1:]):
        for tid, e in pos.items():
            out[i, int(tid)] = e["logprob"]
    assert not np.isnan(out).any(), "a token without a log-probability"
    return out


def families(a, work):
    for arch in a.archs.split(","):
        f16 = write_family_gguf(work / f"{arch}-f16.gguf", arch, 0)
        for ty in a.types.split(","):
            path = f16 if ty == "f16" else quantize_q4_k_m(f16, work / f"{arch}-q4_k_m.gguf")
            toks, lc, n0 = llama_cpp_run(path)
            ours = inferscope_logits(path, toks, lc.shape[1])
            rows = np.arange(len(toks))
            top2 = np.argsort(-lc, -1)[:, :2]
            margin = lc[rows, top2[:, 0]] - lc[rows, top2[:, 1]]
            theirs_margin = ours[rows, top2[:, 0]] - ours[rows, top2[:, 1]]
            steps = slice(n0 - 1, n0 - 1 + STEPS)
            same = (np.argmax(ours, -1) == top2[:, 0])[steps]
            print(f"{arch:9s} {ty:6s} rel {rel(ours, lc):.2e}  "
                  f"max|dlogit| {np.abs(centred(ours) - centred(lc)).max():.4f}  "
                  f"max|dmargin| {np.abs(margin - theirs_margin).max():.4f}  "
                  f"same top token {same.sum()}/{STEPS}  "
                  f"llama.cpp's margins where not {np.round(margin[steps][~same], 4).tolist()}",
                  flush=True)


def forward(W, T, toks, q8k=False, heads=4, kv_heads=2, head_dim=64, eps=1e-6, base=10_000.0):
    """The Llama of tiny_families.py in float64 (llama.cpp's RoPE of adjacent
    pairs), each quantized weight's product fed Q8_K-rounded activations
    when `q8k`."""
    def q8k_round(x):
        x = x.astype(np.float32)
        out = np.zeros_like(x)
        for r in range(x.shape[0]):
            for b in range(0, x.shape[1], 256):
                blk = x[r, b:b + 256]
                mx = blk[np.argmax(np.abs(blk))]
                if mx != 0:
                    iscale = np.float32(-127.0) / mx
                    # llama.cpp's nearest_int: halves to even, as np.rint.
                    out[r, b:b + 256] = np.minimum(np.rint(iscale * blk), 127) * (1 / iscale)
        return out.astype(np.float64)

    def mm(x, name):
        if q8k and T[name] not in ("F32", "F16"):
            x = q8k_round(x)
        return x @ W[name].T

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x, pos):
        inv = base ** (-np.arange(0, head_dim, 2) / head_dim)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        o = np.empty_like(x)
        o[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        o[..., 1::2] = x[..., 0::2] * s + x[..., 1::2] * c
        return o

    n = len(toks)
    pos = np.arange(n, dtype=np.float64)
    h = W["token_embd.weight"][toks]
    layers = 1 + max(int(k.split(".")[1]) for k in W if k.startswith("blk."))
    for layer in range(layers):
        p = f"blk.{layer}."
        x = rms(h, W[p + "attn_norm.weight"])
        q = rope(mm(x, p + "attn_q.weight").reshape(n, heads, head_dim), pos)
        k = rope(mm(x, p + "attn_k.weight").reshape(n, kv_heads, head_dim), pos)
        v = mm(x, p + "attn_v.weight").reshape(n, kv_heads, head_dim)
        o = np.empty((n, heads, head_dim))
        for hh in range(heads):
            g = hh // (heads // kv_heads)
            s = q[:, hh] @ k[:, g].T / np.sqrt(head_dim) + np.triu(np.full((n, n), -np.inf), 1)
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, g]
        h = h + mm(o.reshape(n, -1), p + "attn_output.weight")
        x = rms(h, W[p + "ffn_norm.weight"])
        g, u = mm(x, p + "ffn_gate.weight"), mm(x, p + "ffn_up.weight")
        h = h + mm(g / (1 + np.exp(-g)) * u, p + "ffn_down.weight")
    return mm(rms(h, W["output_norm.weight"]), "output.weight")


def sensitivity(a, work):
    path = quantize_q4_k_m(write_family_gguf(work / "llama-f16.gguf", "llama", 0),
                           work / "llama-q4_k_m.gguf")
    r = gguf.GGUFReader(str(path))
    W = {t.name: dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)])
         .astype(np.float64) for t in r.tensors}
    T = {t.name: t.tensor_type.name for t in r.tensors}
    toks, lc, _ = llama_cpp_run(path, steps=0, threads=1)
    exact, rounded = forward(W, T, toks), forward(W, T, toks, q8k=True)
    print(f"types {sorted(set(T.values()))}, {len(toks)} positions")
    print(f"f64 with Q8_K-rounded activations vs without: {rel(rounded, exact):.2e}")
    print(f"llama.cpp vs f64 without / with Q8_K rounding: {rel(lc, exact):.2e} / "
          f"{rel(lc, rounded):.2e}")
    rng = np.random.default_rng(1)
    for noise in (1e-7, 1e-6, 1e-5, 1e-4):
        Wp = dict(W)
        e = W["token_embd.weight"]
        Wp["token_embd.weight"] = e * (1 + noise * rng.standard_normal(e.shape))
        print(f"token embeddings x (1 + {noise:g}·N(0,1)): logits move "
              f"{rel(forward(Wp, T, toks), exact):.2e} without, "
              f"{rel(forward(Wp, T, toks, q8k=True), rounded):.2e} with Q8_K rounding")
    one = llama_cpp_run(path, steps=0, batch=1, threads=1)[1]
    print(f"llama.cpp, prompt in one batch vs token by token: {rel(one, lc):.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("families")
    f.add_argument("--archs", default="llama,qwen3,gemma3,phi3,gemma2,qwen3moe,mixtral")
    f.add_argument("--types", default="f16,q4_k_m")
    sub.add_parser("sensitivity")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        {"families": families, "sensitivity": sensitivity}[a.cmd](a, Path(d))


if __name__ == "__main__":
    main()
