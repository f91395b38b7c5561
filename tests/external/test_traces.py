"""OpenTelemetry traces end to end: real OTLP receivers (HTTP/protobuf, and
gRPC served by grpcio) that decode the wire format with the official
`opentelemetry-proto` package, and a server started with
`--otlp-traces-endpoint` pointing at them."""

from __future__ import annotations

import json
import secrets
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
import requests
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from conftest import MODEL, Server, free_port


class Spans:
    """Every span a receiver got, with its resource attributes."""

    def __init__(self):
        self.spans: list[tuple[dict, Span]] = []
        self.requests = 0
        self.lock = threading.Lock()

    def add(self, req: ExportTraceServiceRequest):
        with self.lock:
            self.requests += 1
            for rs in req.resource_spans:
                res = {a.key: value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.spans.extend((res, s) for s in ss.spans)

    def trace(self, trace_id: str, name: str = "llm_request", timeout: float = 10.0):
        """Every span of `trace_id` once its `name` span has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = [(r, s) for r, s in self.spans if s.trace_id.hex() == trace_id]
            if any(s.name == name for _, s in spans):
                return spans
            time.sleep(0.02)
        pytest.fail(f"no {name} span of trace {trace_id} within {timeout} s")


class Receiver(Spans):
    """An OTLP/HTTP traces endpoint (`POST /v1/traces`, protobuf)."""

    def __init__(self):
        super().__init__()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                ok = (self.path == "/v1/traces"
                      and self.headers.get("Content-Type") == "application/x-protobuf")
                if ok:
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    receiver.add(req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.http.shutdown()
        self.http.server_close()


class GrpcReceiver(Spans, trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC traces endpoint: grpcio serving the official
    `TraceService`, keeping the metadata each export came with."""

    def __init__(self):
        Spans.__init__(self)
        self.metadata: list[dict] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):  # noqa: N802 (the service's method name)
        with self.lock:
            self.metadata.append(dict(context.invocation_metadata()))
        self.add(request)
        return ExportTraceServiceResponse()

    def stop(self):
        self.server.stop(grace=None)


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(span: Span) -> dict:
    return {a.key: value(a.value) for a in span.attributes}


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def traced_server(receiver, workdir):
    mp = pytest.MonkeyPatch()
    # Export every 50 ms so the test waits milliseconds, not the default 5 s.
    mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    mp.setenv("OTEL_SERVICE_NAME", "inferscope-test")
    mp.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
    try:
        # No path: the server adds /v1/traces. A small step budget chunks prompts;
        # without prefix caching every prompt token is prefilled (counted below).
        s = Server(["--otlp-traces-endpoint", f"http://127.0.0.1:{receiver.port}",
                    "--max-num-batched-tokens", "64", "--max-num-seqs", "64",
                    "--sim-profile", "tiny",
                    "--no-enable-prefix-caching"], workdir)
    finally:
        mp.undo()
    yield s
    s.stop()


def new_parent() -> tuple[str, str]:
    return secrets.token_hex(16), secrets.token_hex(8)


def post(server, path, body, trace_id, parent_id, stream=False):
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "vendor=t61"}
    return requests.post(server.base + path, json=body, headers=headers, stream=stream, timeout=30)


def read_stream(r) -> dict:
    """The usage of an SSE response (its last chunk with usage)."""
    usage = None
    for line in r.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
    return usage


CASES = [
    ("/v1/completions", False, {"prompt": "PROMPT"}),
    ("/v1/completions", True, {"prompt": "PROMPT"}),
    ("/v1/chat/completions", False, {"messages": [{"role": "user", "content": "PROMPT"}]}),
    ("/v1/chat/completions", True, {"messages": [{"role": "user", "content": "PROMPT"}]}),
]


@pytest.mark.parametrize("path,stream,body", CASES, ids=["completions", "completions-stream",
                                                       "chat", "chat-stream"])
def test_request_spans_match_the_response(traced_server, receiver, path, stream, body):
    trace_id, parent_id = new_parent()
    # A prompt of its own, so each trace is easy to tell apart in the logs.
    body = json.loads(json.dumps(body).replace("PROMPT", trace_id + "x" * 150))
    body = {"model": MODEL, "max_tokens": 12, "ignore_eos": True, "temperature": 0.5,
            "stream": stream, **body}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = post(traced_server, path, body, trace_id, parent_id, stream=stream)
    assert r.status_code == 200, r.text
    tp = r.headers["traceparent"].split("-")
    assert tp[0] == "00" and tp[1] == trace_id and tp[3] == "01", tp
    usage = read_stream(r) if stream else r.json()["usage"]
    assert usage["completion_tokens"] == 12

    spans = receiver.trace(trace_id)
    (res, req), = [(res, s) for res, s in spans if s.name == "llm_request"]
    assert res["service.name"] == "inferscope-test"
    assert res["deployment.environment"] == "ci"
    assert req.kind == Span.SPAN_KIND_SERVER
    assert req.parent_span_id.hex() == parent_id
    assert req.span_id.hex() == tp[2], "the response names the request's span"
    assert req.trace_state == "vendor=t61"
    assert req.status.code == Status.STATUS_CODE_OK
    a = attrs(req)
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.request.model"] == MODEL
    assert a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.operation.name"] == ("chat" if "chat" in path else "text_completion")
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    assert a["http.route"] == path and a["http.response.status_code"] == 200
    assert r.headers["x-request-id"] == a["gen_ai.request.id"]
    for k in ["time_in_queue", "time_to_first_token", "e2e", "time_in_model_prefill",
              "time_in_model_decode", "time_in_model_inference"]:
        assert a[f"gen_ai.latency.{k}"] >= 0, k
    assert a["gen_ai.latency.e2e"] >= a["gen_ai.latency.time_to_first_token"]
    assert "error.type" not in a

    children = [s for _, s in spans if s.parent_span_id == req.span_id]
    assert len(children) == len(spans) - 1, "every other span is a child of the request"
    names = [s.name for s in sorted(children, key=lambda s: s.start_time_unix_nano)]
    assert names[0] == "queued" and names[-1] == "decode", names
    prefills = [s for s in children if s.name == "prefill"]
    # A 64-token step budget splits the prompt into chunks.
    assert len(prefills) == -(-usage["prompt_tokens"] // 64), names
    assert sum(attrs(s)["inferscope.prefill.tokens"] for s in prefills) == usage["prompt_tokens"]
    for s in children:
        assert req.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano \
            <= req.end_time_unix_nano, s.name
    finished = [e for e in req.events if e.name == "finished"]
    assert len(finished) == 1


def test_an_aborted_stream_ends_its_span_with_an_error(traced_server, receiver):
    trace_id, parent_id = new_parent()
    body = {"model": MODEL, "prompt": "abort me", "max_tokens": 4000, "ignore_eos": True,
            "stream": True}
    r = post(traced_server, "/v1/completions", body, trace_id, parent_id, stream=True)
    assert r.status_code == 200
    for line in r.iter_lines():
        if line.startswith(b"data: "):
            break
    r.close()  # the client goes away mid-stream
    spans = receiver.trace(trace_id)
    (req,) = [s for _, s in spans if s.name == "llm_request"]
    assert req.status.code == Status.STATUS_CODE_ERROR
    assert attrs(req)["error.type"] == "abort"
    assert req.parent_span_id.hex() == parent_id
    assert req.end_time_unix_nano > req.start_time_unix_nano


def test_a_refused_request_ends_its_span_with_its_status(traced_server, receiver):
    trace_id, parent_id = new_parent()
    r = post(traced_server, "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -1},
             trace_id, parent_id)
    assert r.status_code == 400
    assert r.headers["traceparent"].split("-")[1] == trace_id
    (req,) = [s for _, s in receiver.trace(trace_id) if s.name == "llm_request"]
    assert req.status.code == Status.STATUS_CODE_ERROR
    a = attrs(req)
    assert a["error.type"] == "400" and a["http.response.status_code"] == 400


def test_an_invalid_traceparent_starts_a_new_trace(traced_server, receiver):
    zero = "0" * 32
    r = post(traced_server, "/v1/completions",
             {"model": MODEL, "prompt": "hi", "max_tokens": 2}, zero, "1" * 16)
    assert r.status_code == 200
    trace_id, span_id = r.headers["traceparent"].split("-")[1:3]
    assert trace_id != zero
    (req,) = [s for _, s in receiver.trace(trace_id) if s.name == "llm_request"]
    assert req.span_id.hex() == span_id
    assert req.parent_span_id == b"", "a root span"


def test_an_unreachable_collector_costs_only_a_count(workdir, monkeypatch):
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "300")
    dead = free_port()  # nothing listens there
    s = Server(["--otlp-traces-endpoint", f"http://127.0.0.1:{dead}/v1/traces",
                "--sim-profile", "tiny"], workdir)
    try:
        for _ in range(5):
            r = requests.post(s.base + "/v1/completions",
                              json={"model": MODEL, "prompt": "hi", "max_tokens": 3}, timeout=30)
            assert r.status_code == 200 and "traceparent" in r.headers
        deadline = time.monotonic() + 10
        dropped = 0.0
        while time.monotonic() < deadline:
            for line in s.metrics_text().splitlines():
                if line.startswith("inferscope_trace_spans_dropped_total{") \
                        and 'reason="export_failed"' in line:
                    dropped = float(line.rsplit(" ", 1)[1])
            if dropped >= 5 * 4:  # request, queued, prefill, decode per request
                break
            time.sleep(0.1)
        assert dropped == 5 * 4, dropped
    finally:
        s.stop()
    warnings = [l for l in s.log.read_text(errors="replace").splitlines()
                if "cannot export trace spans" in l]
    assert len(warnings) == 1, warnings


def test_prometheus_exemplars_are_traces_the_collector_received(traced_server, receiver, make_prometheus):
    """From a latency panel to the trace: Prometheus (exemplar storage on,
    scraping OpenMetrics) returns exemplars whose trace ids are traces the
    OTLP receiver got, of requests this test sent."""
    prom = make_prometheus([f"127.0.0.1:{traced_server.port}"],
                           extra_args=("--enable-feature=exemplar-storage",))
    start = time.time()
    prom.wait_scrape_after(start - 5)
    sent = set()
    for i in range(6):
        trace_id, parent_id = new_parent()
        r = post(traced_server, "/v1/completions",
                 {"model": MODEL, "prompt": f"exemplar {i}", "max_tokens": 4, "ignore_eos": True},
                 trace_id, parent_id)
        assert r.status_code == 200, r.text
        sent.add(trace_id)
    for t in sent:
        receiver.trace(t)
    prom.wait_scrape_after(time.time())
    query = '{__name__=~"inferscope_(e2e_request_latency_seconds|time_to_first_token_seconds)_bucket"}'
    deadline = time.monotonic() + 30
    while True:
        body = requests.get(prom.base + "/api/v1/query_exemplars",
                            params={"query": query, "start": f"{start - 60:.3f}",
                                    "end": f"{time.time() + 60:.3f}"}, timeout=10).json()
        assert body["status"] == "success", body
        ids = {ex["labels"].get("trace_id") for series in body["data"] for ex in series["exemplars"]}
        if ids & sent or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    ours = ids & sent
    assert ours, f"exemplar trace ids {ids} hold none of the traces sent {sent}"
    with receiver.lock:
        received = {s.trace_id.hex() for _, s in receiver.spans if s.name == "llm_request"}
    assert ours <= received
    # Every traced exemplar is a trace id (32 hex), never a request id.
    assert all(i is None or len(i) == 32 for i in ids), ids


def test_grpc_export_delivers_the_request_spans(workdir, monkeypatch):
    """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc: the spans reach a gRPC
    collector, in the caller's trace, with the configured headers as gRPC
    metadata; with n=2 the one request span counts both choices' tokens."""
    receiver = GrpcReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=t61")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "inferscope-grpc")
    s = Server(["--otlp-traces-endpoint", f"http://127.0.0.1:{receiver.port}",
                "--sim-profile", "tiny"], workdir)
    try:
        trace_id, parent_id = new_parent()
        r = post(s, "/v1/completions", {"model": MODEL, "prompt": "over grpc", "n": 2,
                                        "max_tokens": 6, "ignore_eos": True}, trace_id, parent_id)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        spans = receiver.trace(trace_id)
    finally:
        s.stop()
        receiver.stop()
    (res, req), = [(res, s) for res, s in spans if s.name == "llm_request"]
    assert res["service.name"] == "inferscope-grpc"
    assert req.trace_id.hex() == trace_id and req.parent_span_id.hex() == parent_id
    assert req.span_id.hex() == r.headers["traceparent"].split("-")[2]
    a = attrs(req)
    assert usage["completion_tokens"] == 12
    assert a["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert a["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert a["gen_ai.request.n"] == 2
    assert a["gen_ai.response.finish_reasons"] == ["length", "length"]
    decodes = sorted(attrs(s)["gen_ai.choice.index"] for _, s in spans if s.name == "decode")
    assert decodes == [0, 1], "each choice has its own children"
    assert receiver.metadata and all(m.get("x-tenant") == "t61" for m in receiver.metadata)


@pytest.mark.parametrize("stream", [False, True], ids=["full", "stream"])
def test_n2_span_counts_every_choice_and_spans_them(traced_server, receiver, stream):
    """n=2: one request span whose output tokens are the response's
    completion tokens, whose e2e covers the slower choice and whose TTFT is
    the earlier first token."""
    trace_id, parent_id = new_parent()
    body = {"model": MODEL, "prompt": "two choices", "n": 2, "max_tokens": 9,
            "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = post(traced_server, "/v1/completions", body, trace_id, parent_id, stream=stream)
    assert r.status_code == 200, r.text
    usage = read_stream(r) if stream else r.json()["usage"]
    assert usage["completion_tokens"] == 18
    spans = receiver.trace(trace_id)
    (req,) = [s for _, s in spans if s.name == "llm_request"]
    a = attrs(req)
    assert a["gen_ai.usage.output_tokens"] == a["gen_ai.usage.completion_tokens"] == 18
    decodes = [s for _, s in spans if s.name == "decode"]
    assert sorted(attrs(s)["gen_ai.usage.output_tokens"] for s in decodes) == [9, 9]
    queued = [s for _, s in spans if s.name == "queued"]
    # Engine instants, as the children show them: the first token of either
    # choice and the end of the later one.
    first_token = min(s.start_time_unix_nano for s in decodes)
    last_end = max(s.end_time_unix_nano for s in decodes)
    arrival = min(s.start_time_unix_nano for s in queued)
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx((first_token - arrival) / 1e9, abs=2e-6)
    assert a["gen_ai.latency.e2e"] == pytest.approx((last_end - arrival) / 1e9, abs=2e-6)
