#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer.json (GPT-2 style pre-tokenizer) on this
repository's Rust and Markdown files, for load tests that need a real
tokenizer without a download: `pip install tokenizers`, then
`scripts/make-bpe-tokenizer.py OUT_DIR`. Used by itl-under-tokenization.sh."""
import glob
import os
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
out = sys.argv[1] if len(sys.argv) > 1 else "."
files = sorted(
    glob.glob(f"{root}/crates/**/*.rs", recursive=True)
    + glob.glob(f"{root}/docs/**/*.md", recursive=True)
    + glob.glob(f"{root}/*.md")
)
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=32000,
    special_tokens=["<|endoftext|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train(files, trainer)
os.makedirs(out, exist_ok=True)
tok.save(os.path.join(out, "tokenizer.json"))
print(f"{out}/tokenizer.json: {tok.get_vocab_size()} tokens from {len(files)} files")
