"""Tiny random-weight GGUFs of the model families beyond Llama (Qwen3,
Gemma 3, Phi-3, Gemma 2, and the mixtures of experts Qwen3-MoE and Mixtral),
written as llama.cpp's converter writes them, for the comparison of greedy
tokens between llama.cpp and inferscope (test_model_families.py).

The layout follows `convert_hf_to_gguf.py`: llama.cpp's tensor names and
metadata keys, q/k rows in the Hugging Face (NeoX) order these families use,
Gemma's RMSNorm weights stored with the 1 of `x̂ · (1 + w)` already added, and
no `output.weight` where the head is tied to the embeddings. The shapes are
multiples of 256 along every weight's input, so that llama.cpp's Q4_K_M
(`quantize`) really stores Q4_K/Q6_K blocks instead of falling back to other
types. The vocabulary is tiny_gguf.py's SentencePiece one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import string
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tiny_gguf import vocabulary


@dataclass(frozen=True)
class Family:
    """One architecture's shape and what its layers hold."""

    arch: str
    layers: int
    qk_norm: bool
    post_norms: bool
    tied: bool
    rope_base: float
    sliding_window: int | None = None
    fused: bool = False
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # Mixture of experts: experts per layer, and how many each token uses.
    experts: int = 0
    experts_used: int = 0


@dataclass(frozen=True)
class Shape:
    """The sizes every family's file is written with (each a multiple of 256
    along a weight's input). `layers`, `experts` and `experts_used` replace
    the family's own when given; `vocab` pads the vocabulary to that size."""

    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    ffn: int = 512
    # One expert's width (a multiple of 256, the down product's input).
    expert_ffn: int = 256
    context: int = 2048
    layers: int | None = None
    experts: int | None = None
    experts_used: int | None = None
    vocab: int | None = None


# What the external tests use: small enough to write and run in seconds.
TINY = Shape()
# For speed comparisons (scripts/llamacpp-compare.sh): the ~88M-parameter
# Llama of scripts/make-llama-gguf.py (hidden 768, 12 layers, 12/4 heads, MLP
# 2048, vocabulary 32000) for every family; the mixtures of experts with 8
# experts of width 512, 2 per token. Gemma 3's global layer every sixth
# layer fits 12 layers.
BENCH = Shape(hidden=768, heads=12, kv_heads=4, head_dim=64, ffn=2048, expert_ffn=512,
              context=4096, layers=12, experts=8, experts_used=2, vocab=32000)

FAMILIES = {
    # Llama itself (q/k rows as llama.cpp's converter permutes them do not
    # matter for random weights: both sides read the same file).
    "llama": Family("llama", layers=2, qk_norm=False, post_norms=False, tied=False,
                    rope_base=10_000.0),
    "qwen3": Family("qwen3", layers=2, qk_norm=True, post_norms=False, tied=False,
                    rope_base=1_000_000.0),
    # Six layers: llama.cpp's Gemma 3 makes every sixth layer global, the
    # others local with a window of 8 positions (RoPE base 10⁴ there, 10⁶
    # in the global layer).
    "gemma3": Family("gemma3", layers=6, qk_norm=True, post_norms=True, tied=True,
                     rope_base=1_000_000.0, sliding_window=8),
    # Phi-3: q/k/v in one `attn_qkv`, gate and up in one `ffn_up`.
    "phi3": Family("phi3", layers=2, qk_norm=False, post_norms=False, tied=False,
                   rope_base=10_000.0, fused=True),
    # Gemma 2: even layers local, odd ones global; both soft-caps.
    "gemma2": Family("gemma2", layers=2, qk_norm=False, post_norms=True, tied=True,
                     rope_base=10_000.0, sliding_window=8, attn_softcap=50.0, final_softcap=30.0),
    # Qwen3-MoE: Qwen3 with every layer's MLP 4 experts, 2 per token.
    "qwen3moe": Family("qwen3moe", layers=2, qk_norm=True, post_norms=False, tied=False,
                       rope_base=1_000_000.0, experts=4, experts_used=2),
    # Mixtral: written by llama.cpp's converter as `llama` with experts.
    "mixtral": Family("llama", layers=2, qk_norm=False, post_norms=False, tied=False,
                      rope_base=1_000_000.0, experts=4, experts_used=2),
}


def padded_vocabulary(size: int) -> tuple[list[str], list[float], list[int]]:
    """`vocabulary()` grown to `size` tokens: first every "▁ab" and "▁abc"
    piece (so that scripts/llamacpp-compare.sh finds its one-token prompt
    words, as in make-llama-gguf.py's vocabulary), then private-use
    characters no prompt contains. Every earlier piece keeps its id; the
    added pieces all start a word, and every prefix of a word piece was
    already a piece, so a word that was one piece stays one piece."""
    tokens, scores, types = vocabulary()
    have = set(tokens)
    letters = string.ascii_lowercase
    extra = ["\u2581" + "".join(t) for n in (2, 3) for t in itertools.product(letters, repeat=n)]
    pua = (chr(c) for c in itertools.chain(range(0xE000, 0xF900), range(0xF0000, 0xFFFFE)))
    pieces = itertools.chain((t for t in extra if t not in have), pua)
    while len(tokens) < size:
        piece = next(pieces)
        tokens.append(piece)
        scores.append(-100.0 + len(piece))
        types.append(int(gguf.TokenType.NORMAL))
    if len(tokens) > size:
        raise ValueError(f"vocabulary size {size} is below the {len(tokens)} tokens the tests need")
    return tokens, scores, types


def write_family_gguf(path: Path, arch: str, seed: int = 0, shape: Shape = TINY) -> Path:
    """Writes a random-weight `arch` model of `shape` with F16 layer weights
    to `path`."""
    fam = FAMILIES[arch]
    arch = fam.arch
    if shape.layers is not None:
        fam = dataclasses.replace(fam, layers=shape.layers)
    if fam.experts and shape.experts is not None:
        fam = dataclasses.replace(fam, experts=shape.experts, experts_used=shape.experts_used)
    tokens, scores, types = vocabulary() if shape.vocab is None else padded_vocabulary(shape.vocab)
    if arch == "phi3":
        # llama.cpp's Phi-3 vocabulary setup looks these up by text.
        for t in ("<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"):
            tokens.append(t)
            scores.append(0.0)
            types.append(int(gguf.TokenType.CONTROL))
    vocab = len(tokens)
    not_pieces = np.array(types) != int(gguf.TokenType.NORMAL)
    rng = np.random.default_rng(seed)
    gemma = arch.startswith("gemma")

    def lin(out: int, inp: int) -> np.ndarray:
        # 1/√fan_in keeps activations O(1) through the layers.
        return (rng.standard_normal((out, inp)) / np.sqrt(inp)).astype(np.float16)

    def norm(n: int, mean: float = 1.0) -> np.ndarray:
        # Near `mean` as stored in the file (for Gemma: 1 + w).
        return (mean + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"inferscope-tiny-{arch}")
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_block_count(fam.layers)
    # Mixtral's (`llama` with experts) is the experts' width.
    w.add_feed_forward_length(shape.expert_ffn if arch == "llama" and fam.experts else shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(fam.rope_base)
    if fam.sliding_window is not None:
        w.add_sliding_window(fam.sliding_window)
    if fam.attn_softcap is not None:
        w.add_attn_logit_softcapping(fam.attn_softcap)
    if fam.final_softcap is not None:
        w.add_final_logit_softcapping(fam.final_softcap)
    if fam.experts:
        w.add_expert_count(fam.experts)
        w.add_expert_used_count(fam.experts_used)
        if arch == "qwen3moe":
            w.add_expert_feed_forward_length(shape.expert_ffn)
    w.add_vocab_size(vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    # Gemma multiplies the embeddings by √hidden: smaller ones keep the
    # residual stream O(1) there.
    embd_std = 1.0 / np.sqrt(shape.hidden) if gemma else 1.0
    embd = rng.standard_normal((vocab, shape.hidden)) * embd_std
    # The control and byte tokens get (almost) no logit, so the greedy text
    # is made of whole pieces: comparing two servers' text then compares
    # their tokens (a lone byte of a UTF-8 sequence prints as U+FFFD, which
    # would hide which byte it was), and no EOS ends it early.
    embd[not_pieces] *= 0.01
    w.add_tensor("token_embd.weight", embd.astype(np.float16))
    q_dim, kv_dim = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    for layer in range(fam.layers):
        p = f"blk.{layer}"
        w.add_tensor(f"{p}.attn_norm.weight", norm(shape.hidden))
        if fam.fused:
            w.add_tensor(f"{p}.attn_qkv.weight", lin(q_dim + 2 * kv_dim, shape.hidden))
        else:
            w.add_tensor(f"{p}.attn_q.weight", lin(q_dim, shape.hidden))
            w.add_tensor(f"{p}.attn_k.weight", lin(kv_dim, shape.hidden))
            w.add_tensor(f"{p}.attn_v.weight", lin(kv_dim, shape.hidden))
        if fam.qk_norm:
            w.add_tensor(f"{p}.attn_q_norm.weight", norm(shape.head_dim))
            w.add_tensor(f"{p}.attn_k_norm.weight", norm(shape.head_dim))
        w.add_tensor(f"{p}.attn_output.weight", lin(shape.hidden, q_dim))
        if fam.post_norms:
            # Large, so that the layers outweigh the embedding that the
            # tied head would otherwise read back (the model would repeat
            # its last input token whatever the layers computed).
            w.add_tensor(f"{p}.post_attention_norm.weight", norm(shape.hidden, 4.0))
        w.add_tensor(f"{p}.ffn_norm.weight", norm(shape.hidden))
        if fam.experts:
            # The router stays F32 (the converter and the quantizer keep it);
            # the experts are stacked along a third dimension.
            n, ff = fam.experts, shape.expert_ffn
            w.add_tensor(f"{p}.ffn_gate_inp.weight", lin(n, shape.hidden).astype(np.float32))
            w.add_tensor(f"{p}.ffn_gate_exps.weight", np.stack([lin(ff, shape.hidden) for _ in range(n)]))
            w.add_tensor(f"{p}.ffn_up_exps.weight", np.stack([lin(ff, shape.hidden) for _ in range(n)]))
            w.add_tensor(f"{p}.ffn_down_exps.weight", np.stack([lin(shape.hidden, ff) for _ in range(n)]))
        elif fam.fused:
            w.add_tensor(f"{p}.ffn_up.weight", lin(2 * shape.ffn, shape.hidden))
        else:
            w.add_tensor(f"{p}.ffn_gate.weight", lin(shape.ffn, shape.hidden))
            w.add_tensor(f"{p}.ffn_up.weight", lin(shape.ffn, shape.hidden))
        if not fam.experts:
            w.add_tensor(f"{p}.ffn_down.weight", lin(shape.hidden, shape.ffn))
        if fam.post_norms:
            w.add_tensor(f"{p}.post_ffw_norm.weight", norm(shape.hidden, 4.0))
    w.add_tensor("output_norm.weight", norm(shape.hidden))
    if not fam.tied:
        out = lin(vocab, shape.hidden)
        out[not_pieces] *= 0.01
        w.add_tensor("output.weight", out)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantize_q4_k_m(src: Path, dst: Path) -> Path:
    """`src` quantized to Q4_K_M by llama.cpp's own quantizer (through the
    llama_cpp bindings), as `llama-quantize SRC DST Q4_K_M` would."""
    return quantize(src, dst, "Q4_K_M")


def quantize(src: Path, dst: Path, ftype: str) -> Path:
    """`src` quantized to `ftype` (`Q4_K_M`, `IQ4_XS`, ...: the bindings'
    `LLAMA_FTYPE_MOSTLY_<ftype>`) by llama.cpp's own quantizer, as
    `llama-quantize SRC DST <ftype>` would."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}) returned {rc}")
    return dst


def tensor_types(path: Path) -> dict[str, str]:
    """Each tensor's GGML type name, as stored in `path`."""
    reader = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in reader.tensors}


if __name__ == "__main__":
    import argparse

    cli = argparse.ArgumentParser(description="Writes a random-weight GGUF of one family (F16 layer weights).")
    cli.add_argument("arch", choices=sorted(FAMILIES))
    cli.add_argument("out", type=Path)
    cli.add_argument("--shape", choices=["tiny", "bench"], default="tiny",
                     help="tiny: the external tests' sizes; bench: the ~88M-parameter sizes of the speed comparison")
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--q4-k-m", action="store_true",
                     help="also write OUT with the suffix .q4_k_m.gguf, quantized by llama.cpp's bindings")
    a = cli.parse_args()
    write_family_gguf(a.out, a.arch, a.seed, TINY if a.shape == "tiny" else BENCH)
    if a.q4_k_m:
        quantize_q4_k_m(a.out, a.out.with_suffix(".q4_k_m.gguf"))
    print(a.out)
