"""lm-evaluation-harness (PyPI `lm_eval`), unmodified, against inferscope.

Its `local-completions` model with `tokenizer_backend=remote` (the tokenizer
is the server's: `GET /tokenizer_info`, `POST /tokenize`, `/detokenize`; no
`transformers`) runs a multiple-choice loglikelihood task defined here, on a
local JSONL file (no download), against the demo model. Then the same
scores are recomputed from the server's own log-probabilities, without
lm_eval: each (context, continuation) pair tokenized with `/tokenize`, the
whole sent as a token prompt with `echo` and `max_tokens: 0`, the
continuation's echoed `token_logprobs` summed, the argmax per document
compared with the answer. lm_eval's accuracy must be that accuracy, over
every document, and each of its per-choice loglikelihoods that sum.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import requests

from conftest import Server

# Nothing may be fetched: the dataset is a local file, the tokenizer the server's.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import lm_eval  # noqa: E402  (after the offline switches: `datasets` reads them at import)
from lm_eval.tasks import TaskManager  # noqa: E402

DEMO = "demo"
TASK = "inferscope_tiny_mc"

# Questions on the demo model's book; the answers are not the point (the
# demo model is tiny), the agreement of the two scorings is.
DOCS = [
    {"question": "Mr. Darcy was a very", "choices": ["proud man", "small dog", "green tree"], "answer": 0},
    {"question": "Elizabeth Bennet had four", "choices": ["sisters", "horses", "windows"], "answer": 0},
    {"question": "It is a truth universally", "choices": ["acknowledged", "forgotten", "painted"], "answer": 0},
    {"question": "The ball at Netherfield was", "choices": ["given by Mr. Bingley", "a red apple", "under the sea"], "answer": 0},
    {"question": "Mrs. Bennet wished her daughters to be", "choices": ["married", "sailors", "silent"], "answer": 0},
    {"question": "Mr. Collins was a", "choices": ["clergyman", "river", "cloud"], "answer": 0},
    {"question": "Jane was the eldest of the", "choices": ["Bennet sisters", "stars", "carriages"], "answer": 0},
    {"question": "Lady Catherine de Bourgh lived at", "choices": ["Rosings", "the moon", "a tavern"], "answer": 0},
    {"question": "Mr. Wickham was an officer in the", "choices": ["militia", "kitchen", "garden"], "answer": 0},
    {"question": "Pemberley was the estate of", "choices": ["Mr. Darcy", "Mr. Collins", "Kitty"], "answer": 0},
    {"question": "Lydia ran away with", "choices": ["Wickham", "a teapot", "the vicar"], "answer": 0},
    {"question": "Charlotte Lucas married", "choices": ["Mr. Collins", "Mr. Darcy", "nobody"], "answer": 2},
]


@pytest.fixture(scope="module")
def demo_server(workdir):
    s = Server(["--enable-tokenizer-info-endpoint"], workdir,
               model_args=["--executor", "cpu", "--model", DEMO])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("lm_eval_task")
    data = d / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    # A YAML task as lm_eval's own are written; `json` is the `datasets`
    # builder for local JSON Lines files.
    (d / f"{TASK}.yaml").write_text(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data))}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")
    return d


def run_lm_eval(server: Server, task_dir: Path, tokenized: bool, cache: Path) -> dict:
    os.environ["HF_DATASETS_CACHE"] = str(cache)
    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "model": DEMO,
            "base_url": server.base + "/v1/completions",
            "tokenizer_backend": "remote",
            "tokenized_requests": tokenized,
            "max_retries": 1,
        },
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        bootstrap_iters=0,
        log_samples=True,
    )


def tokenize(base: str, text: str) -> list[int]:
    # lm_eval's remote tokenizer encodes without special tokens.
    r = requests.post(base + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def loglikelihood(base: str, context: str, continuation: str) -> float:
    """The continuation's log-probability given the context, from the
    server's echoed prompt log-probabilities."""
    # As the harness splits a pair: trailing spaces of the context belong
    # to the continuation.
    stripped = context.rstrip()
    continuation = context[len(stripped):] + continuation
    context = stripped
    whole = tokenize(base, context + continuation)
    n_context = len(tokenize(base, context))
    assert 0 < n_context < len(whole), (context, continuation)
    r = requests.post(base + "/v1/completions", json={
        "model": DEMO, "prompt": whole, "max_tokens": 0, "echo": True, "logprobs": 1,
        "temperature": 0,
    }, timeout=120)
    assert r.status_code == 200, r.text
    lps = r.json()["choices"][0]["logprobs"]["token_logprobs"]
    # `max_tokens: 0`: exactly the prompt's positions, the first without a value.
    assert len(lps) == len(whole) and lps[0] is None, lps
    return sum(lps[n_context:])


def test_tokenizer_info_names_what_the_remote_tokenizer_reads(demo_server):
    info = requests.get(demo_server.base + "/tokenizer_info", timeout=10).json()
    for key in ("tokenizer_class", "eos_token", "model_max_length"):
        assert info.get(key) is not None, info
    # The remote tokenizer maps the EOS text back to its id with /tokenize.
    assert len(tokenize(demo_server.base, info["eos_token"])) == 1, info


# Token-id prompts only (`tokenized_requests=True`, lm_eval's default). With
# `tokenized_requests=False` lm_eval sends the decoded text, which the server
# tokenizes with the tokenizer's BOS in front (completions' default, as vLLM),
# while lm_eval counts the context's tokens without it: its continuation window
# is one position early and its scores are not the continuation's (the same
# holds against vLLM with any tokenizer that adds BOS).
def test_lm_eval_accuracy_is_the_servers_logprobs_argmax(demo_server, task_dir, tmp_path):
    tokenized = True
    out = run_lm_eval(demo_server, task_dir, tokenized, tmp_path / "hf-cache")
    assert out is not None
    n = out["n-samples"][TASK]
    assert n["original"] == n["effective"] == len(DOCS), n
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    assert [s["doc_id"] for s in samples] == list(range(len(DOCS)))
    reported = out["results"][TASK]["acc,none"]

    correct = 0
    for doc, sample in zip(DOCS, samples):
        ours = [loglikelihood(demo_server.base, doc["question"], " " + c) for c in doc["choices"]]
        theirs = [resp[0][0] for resp in sample["resps"]]
        assert len(theirs) == len(ours)
        for a, b in zip(theirs, ours):
            assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-4), (doc, theirs, ours)
        best = max(range(len(ours)), key=ours.__getitem__)
        correct += best == doc["answer"]
        assert sample["acc"] == float(best == doc["answer"]), (doc, sample, ours)
    recomputed = correct / len(DOCS)
    print(f"lm_eval tokenized_requests={tokenized}: acc {reported} over {n['effective']} docs; "
          f"recomputed from the server's logprobs: {recomputed}")
    assert reported == pytest.approx(recomputed, abs=1e-12)
