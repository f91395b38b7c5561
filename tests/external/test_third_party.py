"""`inferscope bench serve` against a server that is not ours: llama.cpp's
OpenAI-compatible server (from `llama-cpp-python[server]`) serving a tiny GGUF
that the suite writes (tiny_gguf.py). The same file is served by
`inferscope serve --executor cpu`, so the two servers' token counts for one
prompt can be compared.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

from conftest import INFERSCOPE_BIN, Server, _tail

import openai


def run_bench(base_url: str, workdir: Path, *flags: str) -> tuple[dict, str]:
    """Runs `bench serve` with `flags` (plus where to save the result) and
    returns the result JSON and the printed report."""
    out = workdir / f"bench-{uuid.uuid4().hex[:8]}"
    cmd = [str(INFERSCOPE_BIN), "bench", "serve", "--base-url", base_url, "--disable-tqdm",
           "--save-result", "--result-dir", str(out), "--result-filename", "result.json", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        f"bench exited {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return json.loads((out / "result.json").read_text()), proc.stdout


def test_bench_with_default_flags_completes_against_llama_cpp(llama_cpp_server, workdir):
    # Default flags (the random dataset, 1024 tokens in, 128 out, all sent at
    # once, a UUID x-request-id on each: llama.cpp's server refused the old
    # `bench-<pid>-<n>` ids with an empty 400) except the number of prompts:
    # llama-cpp-python serves one request at a time, and its 1000 take about
    # ten minutes on two cores.
    result, report = run_bench(llama_cpp_server.base_url, workdir, "--num-prompts", "100")
    assert result["completed"] == 100, (result["completed"], report, _tail(llama_cpp_server.log))
    assert result.get("failed", 0) == 0, report
    assert result["model_id"] == llama_cpp_server.model
    assert result["total_input_tokens"] > 0 and result["total_output_tokens"] > 0
    assert result["mean_ttft_ms"] > 0, result
    assert "Successful requests:" in report
    # llama.cpp's server has no /tokenize route: a count it does not give in
    # `usage` is an estimate, and the report must say so.
    for side in ("input", "output"):
        counted_by = result[f"{side}_tokens_counted_by"]
        assert counted_by in ("usage", "estimate"), (side, counted_by)
        labelled = re.search(rf"^{side.capitalize()} tokens:\s+estimated", report, re.M) is not None
        assert labelled == (counted_by == "estimate"), (side, counted_by, report)


def test_llama_cpp_and_inferscope_agree_on_the_same_gguf(llama_cpp_server, tiny_gguf, workdir):
    """One GGUF, two servers: the prompt's token count (from `usage`) is the
    same, since both read the SentencePiece vocabulary in the file."""
    ours = Server([], workdir, model_args=["--executor", "cpu", "--model", str(tiny_gguf),
                                           "--served-model-name", llama_cpp_server.model])
    try:
        prompts = ["the people of the new time", "Hello, world! 42 times.", "which was not", "ünïcödé ok"]
        counts = {}
        for name, base in (("llama.cpp", llama_cpp_server.base_url), ("inferscope", ours.base)):
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            models = [m.id for m in client.models.list().data]
            assert llama_cpp_server.model in models, (name, models)
            counts[name] = []
            for p in prompts:
                c = client.completions.create(model=llama_cpp_server.model, prompt=p, max_tokens=4,
                                              temperature=0)
                assert c.usage is not None, name
                # llama-cpp-python 0.3.36 reports max_tokens + 1 completion
                # tokens on a `length` finish; inferscope reports what it sent.
                if name == "inferscope":
                    assert c.usage.completion_tokens == 4, c.usage
                assert c.usage.completion_tokens >= 1, (name, c.usage)
                counts[name].append(c.usage.prompt_tokens)
        assert counts["llama.cpp"] == counts["inferscope"], counts
    finally:
        ours.stop()
