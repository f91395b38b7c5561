"""deploy/kubernetes/ parses and holds together, offline (no cluster, no network).

PyYAML parses every document; the checks are the ones a cluster would make
first (apiVersion, kind, metadata.name, selectors matching pod labels) plus the
wiring between the objects: the InferencePool selects the pool's pods and names
the picker's Service and port, the picker's scheduling configurations reference
only plugins they declare, and the pods' KV-event config is valid JSON with
vLLM's keys. Metric names and inferscope flags are checked by
crates/inferscope/tests/deploy.rs.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
VLLM_KV_EVENT_KEYS = {"enable_kv_cache_events", "publisher", "endpoint", "replay_endpoint",
                      "buffer_steps", "hwm", "max_queue_size", "topic"}


def documents() -> list[dict]:
    docs = []
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append(doc)
    return docs


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def test_every_document_is_a_kubernetes_object():
    docs = documents()
    assert len(docs) >= 9
    for d in docs:
        assert isinstance(d, dict)
        assert {"apiVersion", "kind", "metadata"} <= d.keys(), d
        assert d["metadata"].get("name"), d


def test_selectors_match_their_pods():
    for d in documents():
        if d["kind"] in ("Deployment", "StatefulSet"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            for k, v in d["spec"]["selector"]["matchLabels"].items():
                assert labels.get(k) == v, d["metadata"]["name"]
            for c in d["spec"]["template"]["spec"]["containers"]:
                assert all(isinstance(a, str) for a in c.get("args", [])), c["name"]


def test_inference_pool_wiring():
    docs = documents()
    (pool,) = by_kind(docs, "InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    sel = pool["spec"]["selector"]["matchLabels"]
    (sts,) = [d for d in by_kind(docs, "StatefulSet")
              if sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
    ports = {p["containerPort"] for c in sts["spec"]["template"]["spec"]["containers"]
             for p in c["ports"]}
    assert {p["number"] for p in pool["spec"]["targetPorts"]} <= ports
    epp = pool["spec"]["endpointPickerRef"]
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    assert epp["port"]["number"] in {p["port"] for p in services[epp["name"]]["spec"]["ports"]}
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels.get("llm-d.ai/engine-type") == "vllm"


def test_one_rank_per_pod_and_kv_events_config():
    (sts,) = by_kind(documents(), "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    value = lambda flag: args[args.index(flag) + 1]
    assert value("--data-parallel-size") == "1"
    assert value("--data-parallel-rank") == "$(POD_INDEX)"
    assert value("--metrics-namespace") == "vllm"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    cfg = json.loads(value("--kv-events-config"))
    assert set(cfg) <= VLLM_KV_EVENT_KEYS
    assert cfg["enable_kv_cache_events"] is True and cfg["publisher"] == "zmq"
    assert cfg["topic"].startswith("kv@$(POD_IP)@")
    assert "POD_IP" in env


def test_endpoint_picker_configs_reference_declared_plugins():
    (cm,) = [d for d in by_kind(documents(), "ConfigMap") if d["metadata"]["name"] == "inferscope-epp"]
    assert {"default-plugins.yaml", "precise-plugins.yaml"} <= cm["data"].keys()
    for name, text in cm["data"].items():
        cfg = yaml.safe_load(text)
        assert cfg["kind"] == "EndpointPickerConfig", name
        declared = {p.get("name", p["type"]) for p in cfg["plugins"]}
        for profile in cfg["schedulingProfiles"]:
            for ref in profile["plugins"]:
                assert ref["pluginRef"] in declared, (name, ref)
    precise = yaml.safe_load(cm["data"]["precise-plugins.yaml"])
    (scorer,) = [p for p in precise["plugins"] if p["type"] == "precise-prefix-cache-scorer"]
    assert scorer["parameters"]["kvEventsConfig"]["topicFilter"] == "kv@"


def test_pod_monitors_scrape_pods():
    monitors = by_kind(documents(), "PodMonitor")
    assert len(monitors) == 2, "the existing one and the pool's"
    for m in monitors:
        assert m["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"


# The endpoint picker's keys as the upstream sources define them (read
# 2026-12; the picker ignores unknown JSON keys, so a typo would silently fall
# back to a default: hence these lists):
# - GIE cmd/epp/runner/options.go (kubernetes-sigs/gateway-api-inference-extension):
#   the EPP's flags and its default metric names;
# - llm-d/llm-d-inference-scheduler deploy/config/epp-precise-prefix-cache-config.yaml
#   and pkg/plugins/scorer/precise_prefix_cache.go: plugin type names and the
#   precise scorer's parameters (indexerConfig.tokenizersPoolConfig.modelName
#   is required, the factory fails without it);
# - llm-d/llm-d-kv-cache pkg/kvevents/pool.go: kvEventsConfig and
#   podDiscoveryConfig (default pod selector llm-d.ai/inference-serving=true);
#   pkg/kvcache/kvblock token processor: blockSizeTokens (blockSize deprecated);
# - GIE's prefix plugin config: blockSizeTokens in tokens; `blockSize` alone is
#   the legacy size in characters and fails the plugin's initialisation.
EPP_FLAG_DEFAULTS = {
    "--total-queued-requests-metric": "vllm:num_requests_waiting",
    "--total-running-requests-metric": "vllm:num_requests_running",
    "--kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
}
EPP_FLAGS = {"--pool-name", "--pool-namespace", "--pool-group", "--config-file",
             "--config-text", "--grpc-port", "--grpc-health-port", "--metrics-port",
             "--cache-info-metric", "--lora-info-metric", "-v", *EPP_FLAG_DEFAULTS}
PLUGIN_TYPES = {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer",
                "precise-prefix-cache-scorer", "max-score-picker", "single-profile-handler",
                "decode-filter", "tokenizer", "endpoint-notification-source"}
PREFIX_SCORER_KEYS = {"autoTune", "blockSizeTokens", "maxPrefixBlocksToMatch",
                      "maxPrefixTokensToMatch", "lruCapacityPerServer"}
PRECISE_SCORER_KEYS = {"tokenProcessorConfig", "indexerConfig", "kvEventsConfig",
                       "speculativeIndexing", "speculativeTTL"}
TOKEN_PROCESSOR_KEYS = {"blockSizeTokens", "hashSeed", "hashAlgorithm"}
KV_EVENTS_KEYS = {"zmqEndpoint", "topicFilter", "concurrency", "engineType",
                  "discoverPods", "podDiscoveryConfig"}
POD_DISCOVERY_KEYS = {"podLabelSelector", "podNamespace", "socketPort"}


def pool_pods():
    (sts,) = by_kind(documents(), "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    return sts["spec"]["template"]["metadata"]["labels"], c, lambda f: args[args.index(f) + 1]


def test_endpoint_picker_flags_and_metric_names_are_upstreams():
    (epp,) = [d for d in by_kind(documents(), "Deployment") if d["metadata"]["name"] == "inferscope-epp"]
    (c,) = epp["spec"]["template"]["spec"]["containers"]
    flags = [a for a in c["args"] if a.startswith("-")]
    assert set(flags) <= EPP_FLAGS, set(flags) - EPP_FLAGS
    for flag, name in EPP_FLAG_DEFAULTS.items():
        assert c["args"][c["args"].index(flag) + 1] == name
    assert {p["containerPort"] for p in c["ports"]} == {9002}, "the EPP's default --grpc-port"


def test_endpoint_picker_plugin_keys_are_upstreams():
    labels, _, value = pool_pods()
    block_size = int(value("--block-size"))
    kv = json.loads(value("--kv-events-config"))
    kv_port = int(kv["endpoint"].rsplit(":", 1)[1])
    (cm,) = [d for d in by_kind(documents(), "ConfigMap") if d["metadata"]["name"] == "inferscope-epp"]
    seen = set()
    for name, text in cm["data"].items():
        for p in yaml.safe_load(text)["plugins"]:
            assert p["type"] in PLUGIN_TYPES, (name, p["type"])
            params = p.get("parameters", {})
            seen.add(p["type"])
            if p["type"] == "prefix-cache-scorer":
                assert set(params) <= PREFIX_SCORER_KEYS, (name, set(params) - PREFIX_SCORER_KEYS)
                assert params["blockSizeTokens"] == block_size
            if p["type"] == "precise-prefix-cache-scorer":
                assert set(params) <= PRECISE_SCORER_KEYS, set(params) - PRECISE_SCORER_KEYS
                tp = params["tokenProcessorConfig"]
                assert set(tp) <= TOKEN_PROCESSOR_KEYS and tp["blockSizeTokens"] == block_size
                assert params["indexerConfig"]["tokenizersPoolConfig"]["modelName"]
                ev = params["kvEventsConfig"]
                assert set(ev) <= KV_EVENTS_KEYS, set(ev) - KV_EVENTS_KEYS
                assert kv["topic"].startswith(ev["topicFilter"])
                assert ev["discoverPods"] is True and "zmqEndpoint" not in ev, "pods bind"
                disc = ev["podDiscoveryConfig"]
                assert set(disc) <= POD_DISCOVERY_KEYS
                assert disc["socketPort"] == kv_port
                selector = dict(kv_.split("=", 1) for kv_ in disc["podLabelSelector"].split(","))
                assert selector.items() <= labels.items(), "the selector picks the pool's pods"
    assert {"prefix-cache-scorer", "precise-prefix-cache-scorer"} <= seen
