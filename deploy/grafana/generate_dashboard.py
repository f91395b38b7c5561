#!/usr/bin/env python3
"""Writes inferscope-dashboard.json (Grafana, importable) next to this file.

Run: python3 deploy/grafana/generate_dashboard.py
Every query names metrics as `${prefix}...`, where the `prefix` variable is
`inferscope_` (the default `--metrics-namespace inferscope`) or `vllm:`
(`--metrics-namespace vllm`), so the same dashboard serves both. The one name
that differs beyond the prefix (`inferscope_iteration_tokens`, vLLM's
`vllm:iteration_tokens_total`) is matched by both spellings. HTTP metrics carry
no namespace. The metric names are checked against the schema by
crates/inferscope-metrics/tests/deploy_names.rs.
"""

import json
import pathlib

DS = {"type": "prometheus", "uid": "${datasource}"}
# Label matchers of every engine-level query.
SEL = 'model_name=~"$model_name", engine=~"$engine"'
RI = "$__rate_interval"

_next_id = 0


def _id():
    global _next_id
    _next_id += 1
    return _next_id


def target(expr, legend, ref, exemplar=False):
    t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}
    if exemplar:
        # Grafana asks Prometheus' query_exemplars for this query's series and
        # draws them as dots; one target per panel, or each dot shows twice.
        t["exemplar"] = True
    return t


EXEMPLAR_NOTE = (" Dots are exemplars (OpenMetrics scrape with Prometheus' exemplar storage on): "
                 "the latest request in a bucket, with its trace_id when it was traced (a link to the "
                 "trace when a tracing data source is set up), else its request_id.")


def panel(title, description, targets, unit, x, y, w=12, h=8, kind="timeseries", extra=None):
    if any(t[2:] == (True,) for t in targets):
        description += EXEMPLAR_NOTE
    p = {
        "id": _id(),
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(*t[:2], chr(ord("A") + i), *t[2:]) for i, t in enumerate(targets)],
        "fieldConfig": {
            "defaults": {"unit": unit, "custom": {"lineWidth": 1, "fillOpacity": 5}},
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }
    if extra:
        p["fieldConfig"]["defaults"].update(extra)
    return p


def row(title, y):
    return {"id": _id(), "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def quantiles(metric, what, exemplars=True):
    """p50/p90/p99 over all selected engines, plus p99 per engine; exemplar
    dots on the p99 only where the server attaches exemplars to `metric`."""
    b = f"${{prefix}}{metric}_bucket{{{SEL}}}"
    out = [
        (f"histogram_quantile({q}, sum by (le) (rate({b}[{RI}])))", f"p{int(q * 100)} all engines",
         exemplars and q == 0.99)
        for q in (0.5, 0.9, 0.99)
    ]
    out.append((f"histogram_quantile(0.99, sum by (le, engine) (rate({b}[{RI}])))",
                "p99 engine {{engine}}"))
    s = f"${{prefix}}{metric}_sum{{{SEL}}}"
    c = f"${{prefix}}{metric}_count{{{SEL}}}"
    out.append((f"sum(rate({s}[{RI}])) / sum(rate({c}[{RI}]))", "mean all engines"))
    return out


def ns(metric):
    return f"${{prefix}}{metric}{{{SEL}}}"


def either(native, vllm, suffix):
    """A metric named `native` natively and `vllm` by vLLM: match both spellings."""
    return f'{{__name__=~"${{prefix}}{native}{suffix}|${{prefix}}{vllm}{suffix}", {SEL}}}'


def build():
    panels = []
    y = 0
    panels.append(row("Traffic", y)); y += 1
    panels.append(panel(
        "Finished requests by reason",
        "Requests finished per second by finished_reason (stop, length, abort, error), "
        "summed over engines and per engine. abort = the client went away; error = the engine failed.",
        [(f"sum by (finished_reason) (rate({ns('request_success_total')}[{RI}]))", "{{finished_reason}}"),
         (f"sum by (engine) (rate({ns('request_success_total')}[{RI}]))", "engine {{engine}}")],
        "reqps", 0, y))
    panels.append(panel(
        "HTTP requests by status",
        "HTTP answers per second of the OpenAI routes by status class (2xx, 4xx, 5xx) and route. "
        "429 = admission control (--max-waiting-requests); 4xx = invalid requests; 5xx = server faults. "
        "HTTP metrics carry no namespace and are per server, not per model.",
        [('sum by (status, handler) (rate(http_requests_total{handler=~"/v1/.*"}[' + RI + ']))',
          "{{status}} {{handler}}"),
         (f'sum by (reason) (rate(${{prefix}}admission_rejections_total{{model_name=~"$model_name"}}[{RI}]))',
          "refused at admission: {{reason}}")],
        "reqps", 12, y)); y += 8
    panels.append(panel(
        "Token throughput",
        "Prompt tokens prefilled and tokens generated per second, summed and per engine.",
        [(f"sum(rate({ns('prompt_tokens_total')}[{RI}]))", "prompt, all engines"),
         (f"sum(rate({ns('generation_tokens_total')}[{RI}]))", "generation, all engines"),
         (f"sum by (engine) (rate({ns('generation_tokens_total')}[{RI}]))", "generation, engine {{engine}}")],
        "short", 0, y))
    panels.append(panel(
        "Running and waiting requests",
        "Requests in the running batch and in the waiting queue (preempted ones included), "
        "summed over engines and per engine. A waiting queue that grows while running stays "
        "flat means the server is at capacity.",
        [(f"sum({ns('num_requests_running')})", "running, all engines"),
         (f"sum({ns('num_requests_waiting')})", "waiting, all engines"),
         (f"sum by (engine) ({ns('num_requests_running')})", "running, engine {{engine}}"),
         (f"sum by (engine) ({ns('num_requests_waiting')})", "waiting, engine {{engine}}")],
        "short", 12, y)); y += 8

    panels.append(row("Latency", y)); y += 1
    panels.append(panel(
        "Time to first token",
        "From the server's arrival of the request to its first output token: p50/p90/p99 over all "
        "selected engines, p99 per engine, and the mean. Quantiles are interpolated inside histogram "
        "buckets, so they are exact only to the bucket bounds.",
        quantiles("time_to_first_token_seconds", "TTFT"), "s", 0, y))
    panels.append(panel(
        "Inter-token latency",
        "Gap between successive output deltas of a request (one sample per delta).",
        quantiles("inter_token_latency_seconds", "ITL"), "s", 12, y)); y += 8
    panels.append(panel(
        "End-to-end request latency",
        "From arrival to the last output token of each finished request.",
        quantiles("e2e_request_latency_seconds", "e2e"), "s", 0, y))
    panels.append(panel(
        "Queue time",
        "Time requests spend WAITING before they are scheduled. Long queue times with a busy "
        "device mean more capacity is needed; with an idle device, see the Device row.",
        quantiles("request_queue_time_seconds", "queue"), "s", 12, y)); y += 8

    panels.append(row("KV cache and scheduling", y)); y += 1
    panels.append(panel(
        "KV-cache usage",
        "Fraction of KV blocks in use per engine, and the mean over engines. Near 100% the "
        "scheduler preempts running requests.",
        [(f"avg({ns('kv_cache_usage_perc')})", "mean over engines"),
         (f"max by (engine) ({ns('kv_cache_usage_perc')})", "engine {{engine}}")],
        "percentunit", 0, y, extra={"min": 0, "max": 1}))
    panels.append(panel(
        "Prefix-cache hit rate",
        "Prompt tokens found in the prefix cache over prompt tokens looked up, summed and per engine.",
        [(f"sum(rate({ns('prefix_cache_hits_total')}[{RI}])) / sum(rate({ns('prefix_cache_queries_total')}[{RI}]))",
          "all engines"),
         (f"sum by (engine) (rate({ns('prefix_cache_hits_total')}[{RI}])) / "
          f"sum by (engine) (rate({ns('prefix_cache_queries_total')}[{RI}]))", "engine {{engine}}")],
        "percentunit", 12, y, extra={"min": 0, "max": 1})); y += 8
    panels.append(panel(
        "Preemptions",
        "Running requests preempted per second (their KV blocks freed, recomputed later), summed and "
        "per engine. Sustained preemptions mean the KV cache is too small for the load.",
        [(f"sum(rate({ns('num_preemptions_total')}[{RI}]))", "all engines"),
         (f"sum by (engine) (rate({ns('num_preemptions_total')}[{RI}]))", "engine {{engine}}")],
        "short", 0, y))
    panels.append(panel(
        "Batch size",
        "Mean sequences per engine step and mean tokens per step, per engine.",
        [(f"sum by (engine) (rate({ns('batch_size_sum')}[{RI}])) / sum by (engine) (rate({ns('batch_size_count')}[{RI}]))",
          "sequences/step, engine {{engine}}"),
         (f"sum by (engine) (rate({either('iteration_tokens', 'iteration_tokens_total', '_sum')}[{RI}])) / "
          f"sum by (engine) (rate({either('iteration_tokens', 'iteration_tokens_total', '_count')}[{RI}]))",
          "tokens/step, engine {{engine}}")],
        "short", 12, y)); y += 8

    panels.append(row("Device and host", y)); y += 1
    panels.append(panel(
        "Device utilisation",
        "Fraction of wall time the executor spent executing steps, per engine and the mean over "
        "engines. Low utilisation while requests wait means the host is the bottleneck.",
        [(f"avg(rate({ns('device_busy_seconds_total')}[{RI}]))", "mean over engines"),
         (f"sum by (engine) (rate({ns('device_busy_seconds_total')}[{RI}]))", "engine {{engine}}"),
         (f"sum by (engine) (rate({ns('engine_idle_seconds_total')}[{RI}]))", "idle, engine {{engine}}")],
        "percentunit", 0, y, extra={"min": 0, "max": 1}))
    panels.append(panel(
        "Host time per phase",
        "Seconds per second each engine loop spends in schedule, execute and postprocess, summed "
        "over engines and per engine. Schedule and postprocess are pure host overhead.",
        [(f"sum by (phase) (rate({ns('engine_step_duration_seconds_sum')}[{RI}]))", "{{phase}}, all engines"),
         (f"sum by (engine, phase) (rate({ns('engine_step_duration_seconds_sum')}[{RI}]))",
          "{{phase}}, engine {{engine}}")],
        "percentunit", 12, y)); y += 8
    panels.append(panel(
        "Engine steps per second",
        "Engine steps executed per second, per engine and summed.",
        [(f"sum(rate({ns('engine_steps_total')}[{RI}]))", "all engines"),
         (f"sum by (engine) (rate({ns('engine_steps_total')}[{RI}]))", "engine {{engine}}")],
        "short", 0, y))
    panels.append(panel(
        "Mean host time per step, by phase",
        "Mean duration of each phase of one engine step.",
        [(f"sum by (phase) (rate({ns('engine_step_duration_seconds_sum')}[{RI}])) / "
          f"sum by (phase) (rate({ns('engine_step_duration_seconds_count')}[{RI}]))", "{{phase}}")],
        "s", 12, y)); y += 8

    panels.append(row("Prefix cache, KV residency and MFU", y)); y += 1
    panels.append(panel(
        "Waiting requests by reason",
        "Waiting requests per reason, summed over engines: capacity = the last scheduling pass "
        "found no KV blocks, sequence slot or token budget for them; deferred = the last step "
        "preempted, and a step that preempts admits nobody. The reasons sum to the waiting queue.",
        [(f"sum by (reason) ({ns('num_requests_waiting_by_reason')})", "{{reason}}")],
        "short", 0, y))
    panels.append(panel(
        "Prompt tokens by source",
        "Prompt tokens per second computed by the model (local_compute) and taken from the prefix "
        "cache (local_cache_hit); their sum is the prompt throughput.",
        [(f"sum by (source) (rate({ns('prompt_tokens_by_source_total')}[{RI}]))", "{{source}}")],
        "short", 12, y)); y += 8
    panels.append(panel(
        "Prefill KV tokens computed per request",
        "Per finished request: prompt tokens whose KV was computed (prompt minus prefix-cache hits).",
        quantiles("request_prefill_kv_computed_tokens", "KV computed", exemplars=False), "short", 0, y))
    panels.append(panel(
        "KV block residency (sampled)",
        "Needs --kv-cache-metrics. p50/p99 over a sample of KV blocks (--kv-cache-metrics-sample): "
        "lifetime from allocation to eviction, idle time before eviction, and the gap a prefix hit "
        "closes. Short idle-before-evict with many hits lost means the cache is too small.",
        [(f"histogram_quantile({q}, sum by (le) (rate(${{prefix}}{m}_bucket{{{SEL}}}[{RI}])))",
          f"p{int(q * 100)} {label}")
         for m, label in (("kv_block_lifetime_seconds", "lifetime"),
                          ("kv_block_idle_before_evict_seconds", "idle before evict"),
                          ("kv_block_reuse_gap_seconds", "reuse gap"))
         for q in (0.5, 0.99)],
        "s", 12, y)); y += 8
    panels.append(panel(
        "Model FLOPs utilisation (estimate)",
        "Needs --enable-mfu-metrics. Estimated model FLOPs per second from the executor's cost model "
        "over the device peak in the peak_flops variable (the sim profile's peak: 989e12 for H100/H200, "
        "312e12 for A100). An estimate, not a measurement.",
        [(f"sum by (engine) (rate({ns('estimated_flops_per_gpu_total')}[{RI}])) / $peak_flops",
          "MFU, engine {{engine}}")],
        "percentunit", 0, y, extra={"min": 0}))
    panels.append(panel(
        "Estimated memory traffic",
        "Needs --enable-mfu-metrics. Estimated bytes per second read (weights once per step, the KV "
        "of every context token) and written (the KV of new tokens), per engine.",
        [(f"sum by (engine) (rate({ns('estimated_read_bytes_per_gpu_total')}[{RI}]))", "read, engine {{engine}}"),
         (f"sum by (engine) (rate({ns('estimated_write_bytes_per_gpu_total')}[{RI}]))", "write, engine {{engine}}")],
        "Bps", 12, y)); y += 8

    templating = [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "options": []},
        # Text : value pairs (Grafana's custom-variable syntax): the value is the
        # prefix the names carry, separator included.
        {"name": "prefix", "label": "Metric namespace", "type": "custom",
         "query": "inferscope : inferscope_,vllm : vllm:",
         "current": {"text": "inferscope", "value": "inferscope_", "selected": True},
         "options": [{"text": "inferscope", "value": "inferscope_", "selected": True},
                     {"text": "vllm", "value": "vllm:", "selected": False}],
         "hide": 0, "multi": False, "includeAll": False,
         "description": "--metrics-namespace of the servers: inferscope (names inferscope_*) by default, "
                        "vllm (names vllm:*) in compatibility mode"},
        {"name": "model_name", "label": "Model", "type": "query", "datasource": DS,
         "query": {"query": "label_values(${prefix}num_requests_running, model_name)", "refId": "model"},
         "definition": "label_values(${prefix}num_requests_running, model_name)",
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "current": {}, "options": [],
         "hide": 0, "sort": 1},
        {"name": "engine", "label": "Engine", "type": "query", "datasource": DS,
         "query": {"query": 'label_values(${prefix}num_requests_running{model_name=~"$model_name"}, engine)',
                   "refId": "engine"},
         "definition": 'label_values(${prefix}num_requests_running{model_name=~"$model_name"}, engine)',
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "current": {}, "options": [],
         "hide": 0, "sort": 3},
        {"name": "peak_flops", "label": "Device peak FLOP/s", "type": "custom",
         "query": "989e12,312e12,60e15",
         "current": {"text": "989e12", "value": "989e12", "selected": True},
         "options": [{"text": v, "value": v, "selected": v == "989e12"}
                     for v in ("989e12", "312e12", "60e15")],
         "hide": 0, "multi": False, "includeAll": False,
         "description": "The denominator of MFU: the peak of the sim profile (h100/h200: 989e12, "
                        "a100: 312e12, tiny: 60e15) or of your device"},
    ]
    return {
        "__inputs": [],
        "title": "inferscope",
        "uid": "inferscope-overview",
        "description": "inferscope / vLLM-compatible inference server: traffic, latency, KV cache, device and host.",
        "tags": ["inferscope", "vllm", "llm"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "templating": {"list": templating},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("inferscope-dashboard.json")
    out.write_text(json.dumps(build(), indent=2) + "\n")
    print(f"wrote {out}")
