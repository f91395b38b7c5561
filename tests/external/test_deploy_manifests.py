"""deploy/kubernetes/ parses and holds together, offline (no cluster, no network).

PyYAML parses every document; the checks are the ones a cluster would make
first (apiVersion, kind, metadata.name, selectors matching pod labels; the core
objects against Kubernetes' own schemas with kubernetes-validate --strict, the
InferencePool against the openAPIV3Schema of GIE's v1 CRD) plus the wiring
between the objects: the InferencePool selects the pool's pods and names the
picker's Service and port, the picker's configurations reference only plugins
they declare and read metric names inferscope serves for the engine type the
pods are labelled with, and the pods' KV-event config is valid JSON with vLLM's
keys. `vllm:` metric names and inferscope flags are checked by
crates/inferscope/tests/deploy.rs.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The Kubernetes release the core objects are validated against (the newest
# kubernetes-validate knows).
KUBERNETES_VERSION = "1.37.0"
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
    assert labels.get(ENGINE_LABEL) in picker_engine_types(), \
        "the pods' engine type is one the picker's configurations define"


def test_one_rank_per_pod_and_kv_events_config():
    (sts,) = by_kind(documents(), "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    value = lambda flag: args[args.index(flag) + 1]
    assert value("--data-parallel-size") == "1"
    assert value("--data-parallel-rank") == "$(POD_INDEX)"
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
    (producer,) = [p for p in precise["plugins"] if p["type"] == "precise-prefix-cache-producer"]
    assert producer["parameters"]["kvEventsConfig"]["topicFilter"] == "kv@"


def test_pod_monitors_scrape_pods():
    monitors = by_kind(documents(), "PodMonitor")
    assert len(monitors) == 2, "the existing one and the pool's"
    for m in monitors:
        assert m["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"


# The endpoint picker as the upstream sources define it. Read 2026-12 from
# llm-d/llm-d-router at tag v0.10.0 (commit 71f4f0999f95b96c49a9d0c4afbd18dfdb943c26),
# the release the manifest pins; recheck these lists when moving the tag. That
# release decodes plugin parameters with DisallowUnknownFields
# (pkg/epp/framework/interface/plugin/registry.go StrictDecoder) and the
# configuration itself strictly (pkg/epp/config/loader/configloader.go), so an
# unknown key stops the picker at start-up: hence these lists.
# - image: ghcr.io/llm-d/llm-d-router-endpoint-picker:<tag>
#   (.github/ISSUE_TEMPLATE/new-release.md, RELEASE-NOTES.md "RELEASE v0.10.0");
# - flags: pkg/epp/server/options.go; the metric flags are deprecated ("use
#   engineConfigs in EndpointPickerConfig instead") and rejected when set;
# - configuration: apix/config/v1alpha1/endpointpickerconfig_types.go (group
#   llm-d.ai; inference.networking.x-k8s.io is the deprecated one);
# - core-metrics-extractor: pkg/epp/framework/plugins/datalayer/extractor/metrics/
#   factories.go (engineConfigs, built-in engines), mapping_registry.go (the
#   pod label llm-d.ai/engine-type), spec.go (`name` or `name{label=value}`);
# - metrics-data-source: pkg/epp/framework/plugins/datalayer/source/metrics/;
# - approx-prefix-cache-producer: .../requestcontrol/dataproducer/approximateprefix/types.go;
# - prefix-cache-scorer: .../scheduling/scorer/prefix/plugin.go;
# - token-producer: .../requestcontrol/dataproducer/tokenizer/tokenizer.go;
# - precise-prefix-cache-producer: .../requestcontrol/dataproducer/preciseprefixcache/producer.go
#   (rejects indexerConfig.tokenizersPoolConfig); its nested configs from
#   llm-d/llm-d-kv-cache (commit 7be76e119ca50c5700b3bca65a19b6a0218a9b62):
#   pkg/kvevents/pool.go (kvEventsConfig, podDiscoveryConfig) and
#   pkg/kvcache/kvblock/token_processor.go.
EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker"
EPP_RELEASE = "v0.10.0"
DEPRECATED_EPP_FLAGS = {"--total-queued-requests-metric", "--total-running-requests-metric",
                        "--kv-cache-usage-percentage-metric", "--lora-info-metric",
                        "--cache-info-metric"}
EPP_FLAGS = {"--pool-name", "--pool-namespace", "--pool-group", "--config-file",
             "--config-text", "--grpc-port", "--grpc-health-port", "--metrics-port",
             "--endpoint-selector", "--endpoint-target-ports", "--refresh-metrics-interval",
             "--ha-enable-leader-election", "--drain-timeout", "--zap-encoder", "-v"}
EPP_CONFIG_API_VERSION = "llm-d.ai/v1alpha1"
EPP_CONFIG_KEYS = {"apiVersion", "kind", "featureGates", "plugins", "schedulingProfiles",
                   "dataLayer", "flowControl", "requestHandler", "saturationDetector", "parser"}
ENGINE_LABEL = "llm-d.ai/engine-type"
BUILTIN_ENGINES = {"vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm", "triton"}
ENGINE_CONFIG_KEYS = {"name", "queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec",
                      "loraSpec", "cacheInfoSpec", "cacheBlockSizeLabelName",
                      "cacheNumBlocksLabelName", "cacheBlockSizeSpec", "cacheNumBlocksSpec",
                      "customMetrics"}
# The plugin types this manifest may use and the parameters each accepts.
PLUGIN_PARAMS = {
    "queue-scorer": set(),
    "kv-cache-utilization-scorer": set(),
    "max-score-picker": set(),
    "single-profile-handler": set(),
    "endpoint-notification-source": set(),
    "metrics-data-source": {"scheme", "path", "port", "insecureSkipVerify", "caCertPath",
                            "clientCertPath", "clientKeyPath", "interval"},
    "core-metrics-extractor": {"engineLabelKey", "defaultEngine", "engineConfigs"},
    "approx-prefix-cache-producer": {"autoTune", "blockSizeTokens", "blockSize",
                                     "maxPrefixBlocksToMatch", "maxPrefixTokensToMatch",
                                     "lruCapacityPerServer"},
    "prefix-cache-scorer": {"prefixMatchInfoProducerName", "matchLengthWeight",
                            "matchLengthScaleTokens"},
    "token-producer": {"modelName", "vllm", "estimate", "udsTokenizerConfig"},
    "precise-prefix-cache-producer": {"tokenProcessorConfig", "indexerConfig",
                                      "kvEventsConfig", "speculativeIndexing",
                                      "speculativeTTL"},
}
TOKEN_PRODUCER_VLLM_KEYS = {"url", "timeout", "mmTimeout"}
TOKEN_PROCESSOR_KEYS = {"blockSizeTokens", "blockSize", "hashSeed"}
KV_EVENTS_KEYS = {"zmqEndpoint", "topicFilter", "concurrency", "engineType",
                  "discoverPods", "podDiscoveryConfig"}
POD_DISCOVERY_KEYS = {"podLabelSelector", "podNamespace", "socketPort"}
# The engine-level series the extractor's specs read, and their types.
SPEC_TYPES = {"queuedRequestsSpec": "gauge", "runningRequestsSpec": "gauge",
              "kvUsageSpec": "gauge", "cacheInfoSpec": "gauge"}
SPEC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")


def pool_pods():
    (sts,) = by_kind(documents(), "StatefulSet")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    return sts["spec"]["template"]["metadata"]["labels"], c, lambda f: args[args.index(f) + 1]


def epp_container():
    (epp,) = [d for d in by_kind(documents(), "Deployment") if d["metadata"]["name"] == "inferscope-epp"]
    containers = epp["spec"]["template"]["spec"]["containers"]
    (c,) = [c for c in containers if c["name"] == "epp"]
    return c, containers


def picker_configs() -> dict[str, dict]:
    (cm,) = [d for d in by_kind(documents(), "ConfigMap") if d["metadata"]["name"] == "inferscope-epp"]
    return {name: yaml.safe_load(text) for name, text in cm["data"].items()}


def plugin_params(cfg, plugin_type):
    return [p.get("parameters") or {} for p in cfg["plugins"] if p["type"] == plugin_type]


def picker_engine_types() -> set[str]:
    """The engine types every picker configuration can read: built-in or configured."""
    common = None
    for cfg in picker_configs().values():
        names = set(BUILTIN_ENGINES)
        for params in plugin_params(cfg, "core-metrics-extractor"):
            names |= {e["name"] for e in params.get("engineConfigs", [])}
        common = names if common is None else common & names
    return common


def served_metrics() -> dict[str, tuple[str, set[str]]]:
    """Name -> (type, labels) of what the server exposes under the default namespace.

    docs/metrics.md is generated from the schema (crates/inferscope-schema)
    and a test fails when the two drift, so its tables are the server's names.
    """
    out = {}
    for line in (REPO / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`"):
            continue
        name = cells[0].strip("`")
        labels = set(re.findall(r"`([a-z_]+)`", cells[3]))
        out[name] = (cells[1], labels)
    assert "inferscope_num_requests_waiting" in out, "docs/metrics.md's tables parsed"
    return out


def test_endpoint_picker_is_a_pinned_llm_d_router_release():
    c, _ = epp_container()
    image, _, tag = c["image"].rpartition(":")
    assert image == EPP_IMAGE, f"the llm-d router's endpoint picker, not {image}"
    assert tag == EPP_RELEASE, f"pinned to the release the keys were read from, not {tag!r}"


def test_endpoint_picker_flags_are_upstreams_and_not_deprecated():
    c, _ = epp_container()
    flags = {a.split("=", 1)[0] for a in c["args"] if a.startswith("-")}
    assert not flags & DEPRECATED_EPP_FLAGS, \
        f"deprecated, rejected by {EPP_RELEASE}: use engineConfigs ({flags & DEPRECATED_EPP_FLAGS})"
    assert flags <= EPP_FLAGS, flags - EPP_FLAGS
    config = c["args"][c["args"].index("--config-file") + 1]
    mount = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["config"]
    assert config.startswith(mount + "/") and config[len(mount) + 1:] in picker_configs()
    assert {p["containerPort"] for p in c["ports"]} == {9002}, "the EPP's default --grpc-port"


def test_endpoint_picker_configs_are_current():
    for name, cfg in picker_configs().items():
        assert cfg["apiVersion"] == EPP_CONFIG_API_VERSION, name
        assert set(cfg) <= EPP_CONFIG_KEYS, (name, set(cfg) - EPP_CONFIG_KEYS)
        declared = {p.get("name", p["type"]): p["type"] for p in cfg["plugins"]}
        for p in cfg["plugins"]:
            assert p["type"] in PLUGIN_PARAMS, (name, p["type"])
            extra = set(p.get("parameters") or {}) - PLUGIN_PARAMS[p["type"]]
            assert not extra, (name, p["type"], extra)
        # The metrics pipeline is explicit: the source feeds the extractor.
        sources = {s["pluginRef"]: [e["pluginRef"] for e in s["extractors"]]
                   for s in cfg["dataLayer"]["sources"]}
        assert all(ref in declared for ref in sources), name
        assert all(e in declared for es in sources.values() for e in es), name
        (src,) = [r for r in sources if declared[r] == "metrics-data-source"]
        assert [declared[e] for e in sources[src]] == ["core-metrics-extractor"], name
        for params in plugin_params(cfg, "prefix-cache-scorer"):
            producer = params.get("prefixMatchInfoProducerName")
            if producer:
                assert declared.get(producer) == "precise-prefix-cache-producer", (name, producer)


def test_engine_configs_read_names_the_server_serves():
    labels, c, value = pool_pods()
    args = c["args"]
    namespace = value("--metrics-namespace") if "--metrics-namespace" in args else "inferscope"
    served = served_metrics()
    engine = labels[ENGINE_LABEL]
    for name, cfg in picker_configs().items():
        extractors = plugin_params(cfg, "core-metrics-extractor")
        assert len(extractors) == 1, f"{name}: one core-metrics-extractor, naming the metrics"
        (params,) = extractors
        assert params.get("engineLabelKey", ENGINE_LABEL) == ENGINE_LABEL, name
        configs = {e["name"]: e for e in params.get("engineConfigs", [])}
        for e in configs.values():
            assert set(e) <= ENGINE_CONFIG_KEYS, (name, set(e) - ENGINE_CONFIG_KEYS)
        if engine in configs:
            assert namespace == "inferscope", "engineConfigs name the default namespace's series"
            e = configs[engine]
            assert set(SPEC_TYPES) <= set(e), (name, "queue, running, KV use and cache info")
            for key, kind in SPEC_TYPES.items():
                m = SPEC_RE.match(e[key])
                assert m, (name, key, e[key])
                metric = m.group(1)
                assert metric in served, f"{name}: {key} {metric} is not a metric inferscope serves"
                mtype, mlabels = served[metric]
                assert mtype == kind, (name, metric, mtype)
                selectors = {kv.split("=", 1)[0].strip() for kv in (m.group(2) or "").split(",") if kv}
                assert selectors <= mlabels, (name, metric, selectors - mlabels)
            _, cache_labels = served[SPEC_RE.match(e["cacheInfoSpec"]).group(1)]
            assert {e.get("cacheBlockSizeLabelName", "block_size"),
                    e.get("cacheNumBlocksLabelName", "num_gpu_blocks")} <= cache_labels
        else:
            # A built-in engine: the pods must then serve vLLM's names.
            assert engine == "vllm" and namespace == "vllm", (name, engine, namespace)


def test_endpoint_picker_plugin_keys_are_upstreams():
    labels, _, value = pool_pods()
    block_size = int(value("--block-size"))
    kv = json.loads(value("--kv-events-config"))
    kv_port = int(kv["endpoint"].rsplit(":", 1)[1])
    _, containers = epp_container()
    seen = set()
    for name, cfg in picker_configs().items():
        for p in cfg["plugins"]:
            params = p.get("parameters") or {}
            seen.add(p["type"])
            if p["type"] == "approx-prefix-cache-producer":
                assert params["blockSizeTokens"] == block_size
            if p["type"] == "token-producer":
                assert params["modelName"], "the served model's Hugging Face id"
                vllm = params["vllm"]
                assert set(vllm) <= TOKEN_PRODUCER_VLLM_KEYS, set(vllm) - TOKEN_PRODUCER_VLLM_KEYS
                port = int(vllm["url"].rsplit(":", 1)[1])
                (render,) = [c for c in containers if c["name"] == "vllm-render"]
                assert render["command"] == ["vllm", "launch", "render"]
                assert render["args"][0] == params["modelName"]
                assert f"--port={port}" in render["args"], "the token producer reaches the sidecar"
            if p["type"] == "precise-prefix-cache-producer":
                assert "tokenizersPoolConfig" not in params.get("indexerConfig", {}), \
                    "rejected: the token-producer tokenizes"
                tp = params["tokenProcessorConfig"]
                assert set(tp) <= TOKEN_PROCESSOR_KEYS and tp["blockSizeTokens"] == block_size
                ev = params["kvEventsConfig"]
                assert set(ev) <= KV_EVENTS_KEYS, set(ev) - KV_EVENTS_KEYS
                assert kv["topic"].startswith(ev["topicFilter"])
                assert ev["discoverPods"] is True and "zmqEndpoint" not in ev, "pods bind"
                disc = ev["podDiscoveryConfig"]
                assert set(disc) <= POD_DISCOVERY_KEYS
                assert disc["socketPort"] == kv_port
                selector = dict(kv_.split("=", 1) for kv_ in disc["podLabelSelector"].split(","))
                assert selector.items() <= labels.items(), "the selector picks the pool's pods"
                # Pool membership events start the per-pod subscribers.
                wired = {e["pluginRef"] for s in cfg["dataLayer"]["sources"]
                         if s["pluginRef"] == "endpoint-notification-source" for e in s["extractors"]}
                assert p.get("name", p["type"]) in wired, name
    assert {"approx-prefix-cache-producer", "precise-prefix-cache-producer",
            "token-producer", "prefix-cache-scorer"} <= seen


def test_core_objects_pass_kubernetes_validate_strict():
    validated = 0
    for d in documents():
        try:
            kubernetes_validate.validate(d, KUBERNETES_VERSION, strict=True)
            validated += 1
        except kubernetes_validate.SchemaNotFoundError:
            # Custom resources: the InferencePool is checked against its CRD below.
            assert d["kind"] in ("InferencePool", "PodMonitor"), d["kind"]
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']}: {e}")
    assert validated >= 7


def _closed(schema):
    """The schema with unknown fields rejected, as a structural CRD prunes them.

    The API server drops fields its schema does not declare, so a misspelt
    key would silently vanish: reject it here instead.
    """
    schema = copy.deepcopy(schema)

    def walk(s):
        if isinstance(s, dict):
            if ("properties" in s and "additionalProperties" not in s
                    and not s.get("x-kubernetes-preserve-unknown-fields")):
                s["additionalProperties"] = False
            for v in s.values():
                walk(v)
        elif isinstance(s, list):
            for v in s:
                walk(v)
    walk(schema)
    return schema


def test_inference_pool_matches_the_gie_v1_crd():
    crd = yaml.safe_load((FIXTURES / "inference.networking.k8s.io_inferencepools.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _closed(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    (pool,) = by_kind(documents(), "InferencePool")
    assert pool["apiVersion"] == f"{crd['spec']['group']}/v1"
    assert pool["kind"] == crd["spec"]["names"]["kind"]
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(pool), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
    # The CRD's two CEL rules (x-kubernetes-validations), which jsonschema
    # does not evaluate.
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") != "Service" or "port" in ref, \
        "port is required when kind is 'Service' or unspecified"
    numbers = [p["number"] for p in pool["spec"]["targetPorts"]]
    assert len(numbers) == len(set(numbers)), "port number must be unique"


def test_the_crd_schema_check_catches_mistakes():
    """The check above fails on what the API server would reject or prune."""
    crd = yaml.safe_load((FIXTURES / "inference.networking.k8s.io_inferencepools.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _closed(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    validator = jsonschema.Draft7Validator(schema)
    (pool,) = by_kind(documents(), "InferencePool")
    for mutate in (lambda p: p["spec"].pop("endpointPickerRef"),          # required in v1
                   lambda p: p["spec"].update(targetPortz=p["spec"]["targetPorts"]),  # pruned
                   lambda p: p["spec"]["targetPorts"][0].update(number=70000),   # > 65535
                   lambda p: p["spec"]["endpointPickerRef"].update(failureMode="Open")):
        bad = copy.deepcopy(pool)
        mutate(bad)
        assert list(validator.iter_errors(bad)), bad["spec"]
