//! `--kv-events-config`: vLLM's `KVEventsConfig` JSON, same keys, same defaults.

use serde::Deserialize;

/// The KV-event settings, as vLLM's `--kv-events-config` JSON spells them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvEventsConfig {
    /// Whether the engines record and publish events at all.
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `zmq` or `null`; unset means `zmq` when events are enabled.
    #[serde(default)]
    pub publisher: Option<String>,
    /// PUB socket: `tcp://*:5557` binds, `tcp://host:5557` connects (vLLM's
    /// rule, see [`binds`]).
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// ROUTER socket that resends buffered batches from a sequence number.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept per engine for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// ZeroMQ high-water mark of the PUB socket (accepted for compatibility:
    /// the pure-Rust socket drops for a slow subscriber on its own bound).
    #[serde(default = "default_hwm")]
    pub hwm: usize,
    /// Batches queued per engine between the engine thread and the publisher;
    /// when full, a step's batch is dropped and counted.
    #[serde(default = "default_max_queue_size")]
    pub max_queue_size: usize,
    /// First frame of every message (llm-d uses `kv@<pod-ip>@<model>`).
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".into()
}
fn default_buffer_steps() -> usize {
    10_000
}
fn default_hwm() -> usize {
    100_000
}
fn default_max_queue_size() -> usize {
    100_000
}

/// Why `--kv-events-config` was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not the JSON object vLLM accepts.
    #[error("--kv-events-config: {0}")]
    Json(#[from] serde_json::Error),
    /// A value out of range or unsupported.
    #[error("--kv-events-config: {0}")]
    Invalid(String),
}

impl KvEventsConfig {
    /// Parses and checks the JSON of `--kv-events-config`.
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let c: Self = serde_json::from_str(json)?;
        let bad = |m: String| Err(ConfigError::Invalid(m));
        match c.publisher.as_deref() {
            None | Some("zmq") | Some("null") => {}
            Some(other) => return bad(format!("unknown publisher `{other}` (zmq or null)")),
        }
        if c.max_queue_size == 0 {
            return bad("max_queue_size must be at least 1".into());
        }
        if c.publishes() {
            split_tcp(&c.endpoint).map_err(ConfigError::Invalid)?;
            if let Some(r) = &c.replay_endpoint {
                split_tcp(r).map_err(ConfigError::Invalid)?;
            }
        }
        Ok(c)
    }

    /// Whether events are recorded and sent on ZeroMQ.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().unwrap_or("zmq") == "zmq"
    }
}

/// `tcp://host:port` → (host, port); only TCP is supported.
pub(crate) fn split_tcp(endpoint: &str) -> Result<(&str, u16), String> {
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(|| {
        format!("endpoint `{endpoint}`: only tcp://host:port endpoints are supported")
    })?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("endpoint `{endpoint}` has no port"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("endpoint `{endpoint}`: bad port `{port}`"))?;
    if host.is_empty() {
        return Err(format!("endpoint `{endpoint}` has no host"));
    }
    Ok((host, port))
}

/// The endpoint of the engine at position `offset` in this process: the
/// port moves up by `offset`, as vLLM moves it by the data-parallel rank.
/// The offset is the local position, not the global rank, so that one rank
/// per pod (any `--data-parallel-rank`) keeps the configured port.
pub(crate) fn offset_endpoint(endpoint: &str, offset: usize) -> Result<String, String> {
    let (host, port) = split_tcp(endpoint)?;
    let port = u16::try_from(offset)
        .ok()
        .and_then(|o| port.checked_add(o))
        .ok_or_else(|| format!("endpoint `{endpoint}`: port + engine offset {offset} overflows"))?;
    Ok(format!("tcp://{host}:{port}"))
}

/// vLLM's rule (`ZmqEventPublisher._socket_setup`): an endpoint containing
/// `*`, `::` or `0.0.0.0` binds (the router connects to us); any other host
/// connects (we push to the router's listening socket). Like vLLM, an IPv6
/// literal such as `[::1]` therefore binds: connect to IPv6 by host name.
pub(crate) fn binds(endpoint: &str) -> bool {
    endpoint.contains('*') || endpoint.contains("::") || endpoint.contains("0.0.0.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_json_parses_with_vllm_defaults() {
        let c = KvEventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
                "topic": "kv@10.0.0.1@m", "replay_endpoint": "tcp://*:5558",
                "buffer_steps": 10000, "hwm": 100000}"#,
        )
        .unwrap();
        assert!(c.publishes());
        assert_eq!(c.topic, "kv@10.0.0.1@m");
        assert_eq!(c.max_queue_size, 100_000);
        let d = KvEventsConfig::parse(r#"{"enable_kv_cache_events": true}"#).unwrap();
        assert!(d.publishes(), "publisher defaults to zmq when enabled");
        assert_eq!(d.endpoint, "tcp://*:5557");
        assert!(!KvEventsConfig::parse("{}").unwrap().publishes());
        let null = r#"{"enable_kv_cache_events": true, "publisher": "null"}"#;
        assert!(!KvEventsConfig::parse(null).unwrap().publishes());
    }

    #[test]
    fn bad_config_names_the_problem() {
        let err = |j: &str| KvEventsConfig::parse(j).unwrap_err().to_string();
        assert!(err(r#"{"enable_kv_cache_event": true}"#).contains("unknown field"));
        assert!(err(r#"{"publisher": "kafka"}"#).contains("kafka"));
        assert!(err(r#"{"enable_kv_cache_events": true, "endpoint": "ipc:///x"}"#).contains("tcp"));
        assert!(
            err(r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:x"}"#).contains("port")
        );
        assert!(err(r#"{"max_queue_size": 0}"#).contains("max_queue_size"));
        assert!(err("[1]").contains("--kv-events-config"));
    }

    #[test]
    fn ports_move_by_local_engine_position() {
        assert_eq!(offset_endpoint("tcp://*:5557", 0).unwrap(), "tcp://*:5557");
        assert_eq!(
            offset_endpoint("tcp://epp:5557", 2).unwrap(),
            "tcp://epp:5559"
        );
        assert!(offset_endpoint("tcp://*:65535", 1).is_err());
        assert!(binds("tcp://*:1") && !binds("tcp://epp.ns.svc:1"));
        assert!(binds("tcp://0.0.0.0:1") && binds("tcp://[::]:1") && binds("tcp://[::1]:1"));
        assert!(!binds("tcp://127.0.0.1:1") && !binds("tcp://10.0.0.1:1"));
    }
}
