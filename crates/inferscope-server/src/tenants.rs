//! Tenants: who sent a request, from the API key that authenticated it
//! (`--api-key-file`), never from a header a client could set.
//!
//! The key file is JSON:
//! `{"tenants": [{"name": "team-a", "key": "…", "weight": 2}, {"name": "team-b", "key_sha256": "…"}]}`.
//! Keys are kept only as SHA-256 digests, so a file with `key_sha256` holds
//! no secret, and a lookup compares digests, not keys.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The tenant of requests authenticated by the single `--api-key`.
pub const DEFAULT_TENANT: &str = "default";

/// Limits the key file format reserves that this server does not enforce
/// yet: a file that sets one is refused rather than silently not honoured.
const NOT_YET_ENFORCED: [&str; 3] = ["max_concurrent", "max_waiting", "tokens_per_minute"];

/// One tenant of the key file.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Its name: what metrics, logs and the scheduler know it by.
    pub name: Arc<str>,
    /// Its share under fair admission.
    pub weight: f64,
}

/// The tenants' keys, by SHA-256 digest.
#[derive(Debug, Clone, Default)]
pub struct TenantKeys {
    by_digest: HashMap<[u8; 32], Arc<Tenant>>,
}

#[derive(Deserialize)]
struct KeyFile {
    tenants: Vec<serde_json::Map<String, serde_json::Value>>,
}

impl TenantKeys {
    /// Reads and checks a key file; the error names the file and the problem.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--api-key-file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("--api-key-file {}: {e}", path.display()))
    }

    /// Parses a key file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: KeyFile = serde_json::from_str(text)
            .map_err(|e| format!("not a key file ({{\"tenants\": [...]}}): {e}"))?;
        if file.tenants.is_empty() {
            return Err("no tenants".into());
        }
        let mut keys = Self::default();
        let mut names = std::collections::BTreeSet::new();
        for (i, entry) in file.tenants.iter().enumerate() {
            let what = |field: &str| format!("tenant {i}: {field}");
            let name = match entry.get("name") {
                Some(serde_json::Value::String(n)) if !n.trim().is_empty() => n.clone(),
                _ => return Err(what("`name` must be a non-empty string")),
            };
            let at = |field: &str| format!("tenant {name:?}: {field}");
            if !names.insert(name.clone()) {
                return Err(at("the name is used twice"));
            }
            for field in entry.keys() {
                if NOT_YET_ENFORCED.contains(&field.as_str()) {
                    return Err(at(&format!(
                        "`{field}` is not enforced by this version; remove it rather than rely on it"
                    )));
                }
                if !["name", "key", "key_sha256", "weight"].contains(&field.as_str()) {
                    return Err(at(&format!(
                        "unknown field `{field}` (expected name, key or key_sha256, weight)"
                    )));
                }
            }
            let digest = match (entry.get("key"), entry.get("key_sha256")) {
                (Some(serde_json::Value::String(k)), None) if !k.is_empty() => {
                    Sha256::digest(k.as_bytes()).into()
                }
                (None, Some(serde_json::Value::String(h))) => parse_digest(h)
                    .ok_or_else(|| at("`key_sha256` must be 64 hexadecimal digits"))?,
                _ => {
                    return Err(at(
                        "needs exactly one of `key` (a non-empty string) and `key_sha256`",
                    ));
                }
            };
            let weight = match entry.get("weight") {
                None => 1.0,
                Some(w) => w
                    .as_f64()
                    .filter(|w| w.is_finite() && *w > 0.0)
                    .ok_or_else(|| at("`weight` must be a positive number"))?,
            };
            let tenant = Arc::new(Tenant {
                name: name.as_str().into(),
                weight,
            });
            if keys.by_digest.insert(digest, tenant).is_some() {
                return Err(at("its key is another tenant's too"));
            }
        }
        Ok(keys)
    }

    /// The tenant whose key the request's `Authorization: Bearer` carries.
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<Arc<Tenant>> {
        let key = headers
            .get(header::AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?;
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_digest.get(&digest).cloned()
    }

    /// Each tenant's weight, for the engines' fair admission.
    pub fn weights(&self) -> BTreeMap<String, f64> {
        self.by_digest
            .values()
            .map(|t| (t.name.to_string(), t.weight))
            .collect()
    }
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {key}").parse().expect("header"),
        );
        h
    }

    #[test]
    fn keys_name_their_tenants() {
        // sha256("key-b"), as `printf key-b | sha256sum` prints it.
        let b_digest: String = Sha256::digest(b"key-b")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let file = format!(
            r#"{{"tenants": [{{"name": "team-a", "key": "key-a", "weight": 3}},
                             {{"name": "team-b", "key_sha256": "{b_digest}"}}]}}"#
        );
        let keys = TenantKeys::parse(&file).expect("valid");
        let a = keys.authenticate(&bearer("key-a")).expect("a");
        assert_eq!((&*a.name, a.weight), ("team-a", 3.0));
        assert_eq!(
            &*keys.authenticate(&bearer("key-b")).expect("b").name,
            "team-b"
        );
        assert!(keys.authenticate(&bearer("key-c")).is_none());
        assert!(keys.authenticate(&bearer("key-a ")).is_none());
        assert!(keys.authenticate(&HeaderMap::new()).is_none());
        assert_eq!(
            keys.weights(),
            BTreeMap::from([("team-a".into(), 3.0), ("team-b".into(), 1.0)])
        );
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            (r#"{"tenants": []}"#, "no tenants"),
            (r#"[1]"#, "not a key file"),
            (r#"{"tenants": [{"key": "k"}]}"#, "`name`"),
            (r#"{"tenants": [{"name": "a"}]}"#, "exactly one of"),
            (
                r#"{"tenants": [{"name": "a", "key": "k", "key_sha256": "00"}]}"#,
                "exactly one of",
            ),
            (
                r#"{"tenants": [{"name": "a", "key_sha256": "xyz"}]}"#,
                "64 hexadecimal",
            ),
            (
                r#"{"tenants": [{"name": "a", "key": "k", "weight": 0}]}"#,
                "positive",
            ),
            (
                r#"{"tenants": [{"name": "a", "key": "k"}, {"name": "a", "key": "j"}]}"#,
                "twice",
            ),
            (
                r#"{"tenants": [{"name": "a", "key": "k"}, {"name": "b", "key": "k"}]}"#,
                "another tenant",
            ),
            (
                r#"{"tenants": [{"name": "a", "key": "k", "max_concurrent": 8}]}"#,
                "not enforced",
            ),
            (
                r#"{"tenants": [{"name": "a", "key": "k", "colour": 8}]}"#,
                "unknown field `colour`",
            ),
        ];
        for (file, want) in cases {
            let err = TenantKeys::parse(file).expect_err(file);
            assert!(err.contains(want), "{file}: {err}");
        }
    }
}
