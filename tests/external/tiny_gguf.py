"""A tiny Llama GGUF written here, for servers that load GGUF files.

Both llama.cpp (through `llama-cpp-python[server]`) and `inferscope serve
--executor cpu` load it, so the suite can run the same model on a third-party
server and on ours. The weights are random (the text it generates is noise);
the file is real: llama.cpp's own `gguf` writer, llama's tensor names and
metadata keys, and a SentencePiece vocabulary (byte fallback plus whole-word
pieces) in `tokenizer.ggml.*`.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np

REPO = Path(__file__).resolve().parents[2]


def bench_words() -> list[str]:
    """The words the bench's random prompts are made of (`WORDS` in the bench's
    dataset.rs, read from there so the two lists cannot drift apart)."""
    src = (REPO / "crates/inferscope-bench/src/dataset.rs").read_text()
    body = re.search(r"const WORDS: &\[&str\] = &\[(.*?)\];", src, re.S)
    assert body, "WORDS not found in the bench's dataset.rs"
    return re.findall(r'"([^"]+)"', body.group(1))


HIDDEN = 64
HEADS = 4
KV_HEADS = 2
LAYERS = 2
FFN = 128
CONTEXT = 4096


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """`<unk>`, `<s>`, `</s>`, the 256 byte tokens, letters, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(gguf.TokenType.BYTE)
    pieces = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces += ["\u2581" + chr(c) for c in range(ord("a"), ord("z") + 1)]
    # The bench's words become single pieces ("▁the"), as common words are in
    # real SentencePiece vocabularies, so its word-built prompts are about one
    # token a word. Every prefix of a word is a piece too: SentencePiece (and llama.cpp's
    # tokenizer) builds a word by merging adjacent pieces, so "▁the" is only
    # reachable through "▁th".
    pieces += ["\u2581" + w[:k] for w in bench_words() for k in range(2, len(w) + 1)]
    for p in dict.fromkeys(pieces):
        tokens.append(p)
        # SentencePiece merges the highest-scoring piece first: longer wins.
        scores.append(-100.0 + len(p))
        types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def write_llama(path: Path, name: str, vocab: tuple[list, list, list],
                w, *, embd: np.ndarray | None = None, output: np.ndarray | None = None,
                residual_only: bool = False, eos: int = 2,
                chat_template: str | None = None) -> Path:
    """Writes a Llama GGUF of this module's shapes (f32 tensors): `vocab` is
    (tokens, scores, types); `w(*shape)` draws each weight not given
    (`embd`, `output`); `residual_only` zeroes the attention and FFN output
    projections, so the layers leave the residual stream as it is."""
    tokens, scores, types = vocab
    n = len(tokens)
    head_dim = HIDDEN // HEADS

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(n)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(eos)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def ones() -> np.ndarray:
        return np.ones(HIDDEN, dtype=np.float32)

    def out_proj(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32) if residual_only else w(*shape)

    # numpy shapes are (out, in); the writer stores GGML's reversed order.
    # The draws keep one order (embeddings, each layer, the head) so a seed
    # always gives the same file.
    writer.add_tensor("token_embd.weight", w(n, HIDDEN) if embd is None else embd)
    for layer in range(LAYERS):
        p = f"blk.{layer}"
        writer.add_tensor(f"{p}.attn_norm.weight", ones())
        writer.add_tensor(f"{p}.attn_q.weight", w(HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{p}.attn_k.weight", w(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{p}.attn_v.weight", w(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{p}.attn_output.weight", out_proj(HIDDEN, HEADS * head_dim))
        writer.add_tensor(f"{p}.ffn_norm.weight", ones())
        writer.add_tensor(f"{p}.ffn_gate.weight", w(FFN, HIDDEN))
        writer.add_tensor(f"{p}.ffn_up.weight", w(FFN, HIDDEN))
        writer.add_tensor(f"{p}.ffn_down.weight", out_proj(HIDDEN, FFN))
    writer.add_tensor("output_norm.weight", ones())
    writer.add_tensor("output.weight", w(n, HIDDEN) if output is None else output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    """Writes the model to `path` (f32 tensors, a few hundred KiB)."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    return write_llama(path, "inferscope-tiny-llama", vocabulary(), w)


if __name__ == "__main__":
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama.gguf")
    write_tiny_llama(out)
    print(out)
