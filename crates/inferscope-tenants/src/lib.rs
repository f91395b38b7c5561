//! inferscope-tenants: who sent a request, from the API key that
//! authenticated it (`--api-key-file`), never from a header a client could
//! set; `serve` and `proxy` both authenticate and limit with it.
//!
//! The key file is JSON:
//! `{"tenants": [{"name": "team-a", "key": "…", "weight": 2}, {"name": "team-b", "key_sha256": "…"}]}`.
//! Keys are kept only as SHA-256 digests, so a file with `key_sha256` holds
//! no secret, and a lookup compares digests, not keys.
//!
//! Each tenant may have limits (`max_concurrent`, `max_waiting`,
//! `tokens_per_minute`); a request over one gets a 429 with `Retry-After`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use inferscope_schema::schema::{TENANT_ANONYMOUS, TENANT_OTHER};

use http::{HeaderMap, header};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The tenant of requests authenticated by the single `--api-key`.
pub const DEFAULT_TENANT: &str = "default";

/// The fields a tenant of the key file may have.
const FIELDS: [&str; 7] = [
    "name",
    "key",
    "key_sha256",
    "weight",
    "max_concurrent",
    "max_waiting",
    "tokens_per_minute",
];

/// One tenant of the key file.
#[derive(Debug, Default)]
pub struct Tenant {
    /// Its name: what metrics, logs and the scheduler know it by.
    pub name: Arc<str>,
    /// Its share under fair admission.
    pub weight: f64,
    /// Its limits (none: unlimited).
    pub limits: TenantLimits,
    /// What it uses now, against the limits.
    usage: TenantUsage,
}

/// A tenant's limits from the key file; each is optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Requests admitted and not finished.
    pub max_concurrent: Option<u64>,
    /// Choices admitted whose first output has not arrived.
    pub max_waiting: Option<u64>,
    /// Prompt and generation tokens over the last 60 s (prompt tokens are
    /// charged at admission, generated ones when the choice finishes).
    pub tokens_per_minute: Option<u64>,
}

/// The counts a tenant's limits are checked against.
#[derive(Debug, Default)]
struct TenantUsage {
    in_flight: AtomicUsize,
    waiting: AtomicUsize,
    tokens: MinuteWindow,
}

/// Which limit refused a request, with the figures for the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenantRejection {
    /// `max_concurrent` requests are in flight.
    MaxConcurrent {
        /// The limit.
        limit: u64,
    },
    /// Admitting the request's choices would exceed `max_waiting`.
    MaxWaiting {
        /// The limit.
        limit: u64,
    },
    /// `used` tokens in the last minute reach `tokens_per_minute`.
    TokensPerMinute {
        /// The limit.
        limit: u64,
        /// Tokens in the window now.
        used: u64,
        /// Seconds until the window is under the limit again.
        retry_after: u64,
    },
}

/// The `reason` label of a request refused by its tenant's own limit.
pub const REASON_TENANT_LIMIT: &str = "tenant_limit";

impl TenantRejection {
    /// The error message of the 429, naming the tenant and the limit.
    pub fn message(&self, tenant: &str) -> String {
        match self {
            Self::MaxConcurrent { limit } => format!(
                "tenant `{tenant}` is at its max_concurrent limit ({limit} requests in flight); retry later"
            ),
            Self::MaxWaiting { limit } => format!(
                "tenant `{tenant}` is at its max_waiting limit ({limit} requests waiting to start); retry later"
            ),
            Self::TokensPerMinute {
                limit,
                used,
                retry_after,
            } => format!(
                "tenant `{tenant}` is over its tokens_per_minute limit ({used} of {limit} tokens in the last minute); retry after {retry_after} s"
            ),
        }
    }

    /// The 429's `Retry-After`, in seconds.
    pub fn retry_after(&self) -> u64 {
        match self {
            Self::MaxConcurrent { .. } | Self::MaxWaiting { .. } => 1,
            Self::TokensPerMinute { retry_after, .. } => *retry_after,
        }
    }
}

impl Tenant {
    /// A tenant without limits (`default`, or one a trusted header named).
    pub fn unlimited(name: &str) -> Self {
        Self {
            name: name.into(),
            weight: 1.0,
            ..Self::default()
        }
    }

    /// Checks the tenant's limits for a request of `choices` choices; the
    /// permit holds its place until every choice's [`TenantChoice`] is gone.
    pub fn admit(self: &Arc<Self>, choices: usize) -> Result<TenantPermit, TenantRejection> {
        let l = &self.limits;
        let u = &self.usage;
        if let Some(limit) = l.tokens_per_minute {
            let now = self.usage.tokens.now();
            let used = u.tokens.sum(now);
            if used >= limit {
                return Err(TenantRejection::TokensPerMinute {
                    limit,
                    used,
                    retry_after: u.tokens.seconds_until_below(limit, now),
                });
            }
        }
        // Count first, then check: two racing requests can both be refused,
        // never both slip past a limit.
        let before = u.in_flight.fetch_add(1, Ordering::AcqRel);
        let mut permit = TenantPermit {
            tenant: Arc::clone(self),
            waiting: 0,
        };
        if let Some(limit) = l.max_concurrent
            && before as u64 >= limit
        {
            return Err(TenantRejection::MaxConcurrent { limit });
        }
        let before = u.waiting.fetch_add(choices, Ordering::AcqRel);
        if let Some(limit) = l.max_waiting
            && (before + choices) as u64 > limit
        {
            u.waiting.fetch_sub(choices, Ordering::AcqRel);
            return Err(TenantRejection::MaxWaiting { limit });
        }
        permit.waiting = choices;
        Ok(permit)
    }
}

/// One admitted request's hold on its tenant's `max_concurrent`; released
/// when dropped (its choices share it).
#[derive(Debug)]
pub struct TenantPermit {
    tenant: Arc<Tenant>,
    /// Choices counted as waiting until handed to [`TenantChoice`]s.
    waiting: usize,
}

impl TenantPermit {
    /// Charges `tokens` to the tenant's tokens per minute.
    pub fn charge(&self, tokens: usize) {
        let w = &self.tenant.usage.tokens;
        w.add(tokens as u64, w.now());
    }

    /// The choices' holds: each counts as waiting until [`TenantChoice::started`].
    pub fn into_choices(mut self) -> Vec<TenantChoice> {
        let choices = std::mem::take(&mut self.waiting);
        let permit = Arc::new(self);
        (0..choices)
            .map(|_| TenantChoice {
                permit: Arc::clone(&permit),
                waiting: true,
            })
            .collect()
    }
}

impl Drop for TenantPermit {
    fn drop(&mut self) {
        let u = &self.tenant.usage;
        u.in_flight.fetch_sub(1, Ordering::AcqRel);
        u.waiting.fetch_sub(self.waiting, Ordering::AcqRel);
    }
}

/// One choice's hold on its tenant's limits.
#[derive(Debug)]
pub struct TenantChoice {
    permit: Arc<TenantPermit>,
    waiting: bool,
}

impl TenantChoice {
    /// The choice's first output arrived: it no longer counts as waiting.
    pub fn started(&mut self) {
        if std::mem::take(&mut self.waiting) {
            self.permit
                .tenant
                .usage
                .waiting
                .fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The choice finished having generated `tokens`.
    pub fn finished(&mut self, tokens: usize) {
        self.started();
        self.permit.charge(tokens);
    }
}

impl Drop for TenantChoice {
    fn drop(&mut self) {
        self.started();
    }
}

/// Tokens per second over the last minute, lock-free: slot `s % 60` holds
/// second `s` (high 32 bits) and its count (low 32), so a stale slot is
/// recognised and restarted by the one compare-and-swap that adds to it.
#[derive(Debug)]
struct MinuteWindow {
    start: Instant,
    slots: [AtomicU64; 60],
}

impl Default for MinuteWindow {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl MinuteWindow {
    /// Seconds since the window began, as the slots count them (from 1, so
    /// an untouched slot, second 0, is never current).
    fn now(&self) -> u64 {
        self.start.elapsed().as_secs() + 1
    }

    fn add(&self, tokens: u64, now: u64) {
        let slot = &self.slots[(now % 60) as usize];
        let second = now & 0xffff_ffff;
        let _ = slot.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            let count = if cur >> 32 == second {
                cur & 0xffff_ffff
            } else {
                0
            };
            Some(second << 32 | (count + tokens).min(0xffff_ffff))
        });
    }

    /// `(second, tokens)` of the slots within the last 60 s at `now`.
    fn live(&self, now: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.slots.iter().filter_map(move |s| {
            let v = s.load(Ordering::Acquire);
            let second = v >> 32;
            (second > 0 && second + 60 > now && second <= now).then_some((second, v & 0xffff_ffff))
        })
    }

    fn sum(&self, now: u64) -> u64 {
        self.live(now).map(|(_, n)| n).sum()
    }

    /// Seconds from `now` until the tokens in the window are under `limit`.
    fn seconds_until_below(&self, limit: u64, now: u64) -> u64 {
        let mut live: Vec<(u64, u64)> = self.live(now).collect();
        live.sort_unstable();
        let mut used: u64 = live.iter().map(|(_, n)| n).sum();
        for (second, n) in live {
            used -= n;
            if used < limit {
                // Second `second` leaves the window at `second + 60`.
                return (second + 60).saturating_sub(now).max(1);
            }
        }
        1
    }
}

/// The tenants' keys, by SHA-256 digest.
#[derive(Debug, Clone, Default)]
pub struct TenantKeys {
    by_digest: HashMap<[u8; 32], Arc<Tenant>>,
}

/// `--tenant-header` with the `--trusted-proxy` peers it is believed from.
#[derive(Debug, Clone)]
pub struct TenantHeader {
    name: http::HeaderName,
    trusted: Vec<(std::net::IpAddr, u8)>,
}

/// The longest tenant name a header may carry.
const MAX_HEADER_TENANT_BYTES: usize = 128;

impl TenantHeader {
    /// Parses the header name and the trusted peers (`ADDR` or `ADDR/BITS`).
    pub fn new(name: &str, trusted: &[String]) -> Result<Self, String> {
        let name = http::HeaderName::try_from(name)
            .map_err(|e| format!("--tenant-header {name:?}: {e}"))?;
        if trusted.is_empty() {
            return Err("--tenant-header needs at least one --trusted-proxy".into());
        }
        let trusted = trusted
            .iter()
            .map(|t| {
                parse_cidr(t).ok_or_else(|| {
                    format!("--trusted-proxy {t:?}: expected an IP address or ADDR/BITS")
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { name, trusted })
    }

    /// Whether `peer` is a trusted proxy.
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.trusted
            .iter()
            .any(|&(net, bits)| in_net(peer, net, bits))
    }

    /// The tenant the header names on a request from `peer`: `None` when
    /// the peer is not trusted or the header is absent (the key decides);
    /// an error for a value that is not a usable name.
    pub fn tenant<'a>(
        &self,
        peer: Option<std::net::IpAddr>,
        headers: &'a HeaderMap,
    ) -> Result<Option<&'a str>, String> {
        if !peer.is_some_and(|p| self.trusts(p)) {
            return Ok(None);
        }
        let Some(v) = headers.get(&self.name) else {
            return Ok(None);
        };
        let name = v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|n| !n.is_empty() && n.len() <= MAX_HEADER_TENANT_BYTES && n.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| format!("header `{}` must name a tenant: 1 to {MAX_HEADER_TENANT_BYTES} printable ASCII characters", self.name))?;
        Ok(Some(name))
    }
}

fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (addr, bits) = match s.split_once('/') {
        Some((a, b)) => (a, Some(b.parse::<u8>().ok()?)),
        None => (s, None),
    };
    let addr: std::net::IpAddr = addr.trim().parse().ok()?;
    let addr = addr.to_canonical();
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let bits = bits.unwrap_or(max);
    (bits <= max).then_some((addr, bits))
}

fn in_net(peer: std::net::IpAddr, net: std::net::IpAddr, bits: u8) -> bool {
    use std::net::IpAddr::{V4, V6};
    match (peer, net) {
        (V4(p), V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(p) & mask == u32::from(n) & mask
        }
        (V6(p), V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(p) & mask == u128::from(n) & mask
        }
        _ => false,
    }
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
            if name == TENANT_ANONYMOUS || name == TENANT_OTHER {
                return Err(at("the name is reserved for the metrics' tenant label"));
            }
            for field in entry.keys() {
                if !FIELDS.contains(&field.as_str()) {
                    return Err(at(&format!(
                        "unknown field `{field}` (expected one of {})",
                        FIELDS.join(", ")
                    )));
                }
            }
            let limit = |field: &str| match entry.get(field) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|n| *n > 0)
                    .map(Some)
                    .ok_or_else(|| at(&format!("`{field}` must be a positive integer"))),
            };
            let limits = TenantLimits {
                max_concurrent: limit("max_concurrent")?,
                max_waiting: limit("max_waiting")?,
                tokens_per_minute: limit("tokens_per_minute")?,
            };
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
                limits,
                usage: TenantUsage::default(),
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

    /// The tenant called `name`, if the file has one.
    pub fn by_name(&self, name: &str) -> Option<Arc<Tenant>> {
        self.by_digest.values().find(|t| &*t.name == name).cloned()
    }

    /// Each tenant's weight, for the engines' fair admission.
    pub fn weights(&self) -> BTreeMap<String, f64> {
        self.by_digest
            .values()
            .map(|t| (t.name.to_string(), t.weight))
            .collect()
    }
}

/// Who may call the API, and as which tenant: `--api-key-file`, the single
/// `--api-key` (tenant `default`), `--tenant-header`; `serve` and `proxy`
/// apply the same rule.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The keys (the single `--api-key` is a file of one tenant).
    keys: Option<TenantKeys>,
    header: Option<TenantHeader>,
}

/// Why a request was not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessRefusal {
    /// No key, or a key that names no tenant: 401.
    Unauthorized,
    /// A trusted peer's tenant header is not a usable name: 400.
    BadTenantHeader(String),
}

impl Access {
    /// From the flags; an empty `api_key` counts as none. The error names
    /// the flag and the problem.
    pub fn new(
        api_key: Option<&str>,
        key_file: Option<&Path>,
        header: Option<TenantHeader>,
    ) -> Result<Self, String> {
        let keys = match (key_file, api_key.filter(|k| !k.is_empty())) {
            (Some(path), _) => Some(TenantKeys::from_file(path)?),
            (None, Some(key)) => {
                let mut keys = TenantKeys::default();
                let digest = Sha256::digest(key.as_bytes()).into();
                keys.by_digest
                    .insert(digest, Arc::new(Tenant::unlimited(DEFAULT_TENANT)));
                Some(keys)
            }
            (None, None) => None,
        };
        Ok(Self { keys, header })
    }

    /// Whether every request is anonymous: no keys and no trusted tenant
    /// header, so [`Access::identify`] has nothing to check.
    pub fn is_open(&self) -> bool {
        self.keys.is_none() && self.header.is_none()
    }

    /// Whether requests need a key (a trusted tenant header aside).
    pub fn requires_key(&self) -> bool {
        self.keys.is_some()
    }

    /// The key file's tenants (`default` for `--api-key`), for fair
    /// admission's weights and the first label slots.
    pub fn keys(&self) -> Option<&TenantKeys> {
        self.keys.as_ref()
    }

    /// The tenant of a request from `peer` (`None`: anonymous, no keys are
    /// set): a trusted peer's tenant header, else the bearer key's tenant.
    pub fn identify(
        &self,
        peer: Option<std::net::IpAddr>,
        headers: &HeaderMap,
    ) -> Result<Option<Arc<Tenant>>, AccessRefusal> {
        if let Some(header) = &self.header {
            match header.tenant(peer, headers) {
                // The gateway authenticated the caller: no key is asked for.
                Ok(Some(name)) => {
                    let tenant = self
                        .keys
                        .as_ref()
                        .and_then(|k| k.by_name(name))
                        .unwrap_or_else(|| Arc::new(Tenant::unlimited(name)));
                    return Ok(Some(tenant));
                }
                Ok(None) => {}
                Err(message) => return Err(AccessRefusal::BadTenantHeader(message)),
            }
        }
        match &self.keys {
            None => Ok(None),
            Some(keys) => keys
                .authenticate(headers)
                .map(Some)
                .ok_or(AccessRefusal::Unauthorized),
        }
    }

    /// Whether `headers` carry a key that opens the API (the console's check).
    pub fn authorizes(&self, headers: &HeaderMap) -> bool {
        self.keys
            .as_ref()
            .is_none_or(|k| k.authenticate(headers).is_some())
    }
}

/// The flags that name each request's tenant, shared by `serve` and `proxy`
/// (flattened into each one's arguments, beside its own `--api-key`).
#[derive(Debug, Clone, clap::Args)]
pub struct TenantArgs {
    /// Tenants and their API keys, a JSON file: {"tenants": [{"name": "team-a",
    /// "key": "…" (or "key_sha256": "…"), "weight": 1, "max_concurrent": 8,
    /// "max_waiting": 64, "tokens_per_minute": 100000}, …]} (limits optional:
    /// over one, 429 with Retry-After; the weight is the tenant's share under
    /// fair admission). Each key names its tenant (the `tenant` label);
    /// requests without a listed key get 401 (docs/tenants.md).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<std::path::PathBuf>,

    /// Take the tenant's name from this request header, set by a gateway
    /// that already authenticated the caller; believed only on connections
    /// from a --trusted-proxy address (elsewhere the header is ignored and
    /// the API key decides). A name from the key file gets that tenant's
    /// weight and limits.
    #[arg(long, value_name = "NAME", requires = "trusted_proxy")]
    pub tenant_header: Option<String>,

    /// Peers whose --tenant-header is believed: IP addresses or ADDR/BITS
    /// networks, comma-separated or repeated.
    #[arg(
        long,
        value_name = "ADDR",
        value_delimiter = ',',
        requires = "tenant_header"
    )]
    pub trusted_proxy: Vec<String>,

    /// Distinct `tenant` label values on the request metrics (`anonymous`
    /// included); every later tenant is counted under `other`, and how many
    /// were is the `tenant_labels_folded` gauge.
    #[arg(long, value_name = "N", default_value_t = inferscope_schema::schema::DEFAULT_MAX_TENANT_LABELS, value_parser = parse_max_tenant_labels)]
    pub max_tenant_labels: usize,
}

impl TenantArgs {
    /// The access rule of these flags and `--api-key`; the error names the
    /// flag and the problem.
    pub fn access(&self, api_key: Option<&str>) -> Result<Access, String> {
        let header = self
            .tenant_header
            .as_deref()
            .map(|h| TenantHeader::new(h, &self.trusted_proxy))
            .transpose()?;
        Access::new(api_key, self.api_key_file.as_deref(), header)
    }
}

/// `--max-tenant-labels`: 1 to 4096 (each value is a set of series per engine).
pub fn parse_max_tenant_labels(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("expected a number from 1 to 4096, got {s:?}")),
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

    fn limited(limits: TenantLimits) -> Arc<Tenant> {
        Arc::new(Tenant {
            limits,
            ..Tenant::unlimited("t")
        })
    }

    #[test]
    fn concurrency_and_waiting_limits_hold_and_release() {
        let t = limited(TenantLimits {
            max_concurrent: Some(2),
            max_waiting: Some(3),
            ..TenantLimits::default()
        });
        let mut a = t.admit(2).expect("first").into_choices();
        let b = t.admit(1).expect("second");
        assert_eq!(
            t.admit(1).expect_err("third in flight"),
            TenantRejection::MaxConcurrent { limit: 2 }
        );
        drop(b);
        // a's two choices wait: two more would make four.
        assert_eq!(
            t.admit(2).expect_err("waiting"),
            TenantRejection::MaxWaiting { limit: 3 }
        );
        a[0].started();
        a[1].finished(5);
        let c = t.admit(2).expect("a's choices started");
        drop((a, c));
        assert_eq!(t.usage.in_flight.load(Ordering::Acquire), 0);
        assert_eq!(t.usage.waiting.load(Ordering::Acquire), 0);
        let e = TenantRejection::MaxConcurrent { limit: 2 };
        assert_eq!(e.retry_after(), 1);
        assert!(
            e.message("t").contains("max_concurrent"),
            "{}",
            e.message("t")
        );
    }

    #[test]
    fn tokens_per_minute_slide_with_the_window() {
        let w = MinuteWindow::default();
        w.add(30, 1);
        w.add(50, 10);
        assert_eq!(w.sum(10), 80);
        assert_eq!(w.sum(60), 80);
        assert_eq!(w.sum(61), 50, "second 1 left the window");
        assert_eq!(w.sum(70), 0);
        // At 20, under 60 once second 1 leaves (at 61): 41 s.
        assert_eq!(w.seconds_until_below(60, 20), 41);
        assert_eq!(w.seconds_until_below(30, 20), 50);
        // A slot is reused a minute later without its old count.
        w.add(7, 61);
        assert_eq!(w.sum(61), 57);
        let t = limited(TenantLimits {
            tokens_per_minute: Some(100),
            ..TenantLimits::default()
        });
        let p = t.admit(1).expect("empty window");
        p.charge(100);
        match t.admit(1).expect_err("at the limit") {
            TenantRejection::TokensPerMinute {
                used, retry_after, ..
            } => {
                assert_eq!(used, 100);
                assert!((1..=60).contains(&retry_after), "{retry_after}");
            }
            other => panic!("{other:?}"),
        }
    }

    fn bearer(key: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {key}").parse().expect("header"),
        );
        h
    }

    #[test]
    fn the_tenant_header_counts_only_from_trusted_peers() {
        let h = TenantHeader::new(
            "x-tenant",
            &["10.0.0.0/8".into(), "::1".into(), "192.168.1.7".into()],
        )
        .expect("valid");
        let mut headers = HeaderMap::new();
        headers.insert("x-tenant", "team-z".parse().expect("header"));
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().expect("ip"));
        assert_eq!(h.tenant(ip("10.3.4.5"), &headers), Ok(Some("team-z")));
        assert_eq!(
            h.tenant(ip("::ffff:10.3.4.5"), &headers),
            Ok(Some("team-z"))
        );
        assert_eq!(h.tenant(ip("::1"), &headers), Ok(Some("team-z")));
        assert_eq!(h.tenant(ip("192.168.1.7"), &headers), Ok(Some("team-z")));
        assert_eq!(h.tenant(ip("192.168.1.8"), &headers), Ok(None));
        assert_eq!(h.tenant(ip("11.0.0.1"), &headers), Ok(None));
        assert_eq!(h.tenant(None, &headers), Ok(None));
        assert_eq!(h.tenant(ip("10.0.0.1"), &HeaderMap::new()), Ok(None));
        headers.insert("x-tenant", "two words".parse().expect("header"));
        assert!(h.tenant(ip("10.0.0.1"), &headers).is_err());
        assert!(TenantHeader::new("x-tenant", &[]).is_err());
        assert!(TenantHeader::new("x-tenant", &["10.0.0.0/33".into()]).is_err());
        assert!(TenantHeader::new("bad header", &["::1".into()]).is_err());
        let all = TenantHeader::new("x-tenant", &["0.0.0.0/0".into()]).expect("any v4");
        assert!(all.trusts("8.8.8.8".parse().expect("ip")));
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
    fn access_takes_a_trusted_header_then_the_key() {
        let header = TenantHeader::new("x-tenant", &["10.0.0.0/8".into()]).expect("valid");
        let access = Access::new(Some("sekrit"), None, Some(header)).expect("valid");
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().expect("ip"));
        let named = |r: Result<Option<Arc<Tenant>>, AccessRefusal>| {
            r.map(|t| t.map(|t| t.name.to_string()))
        };
        assert_eq!(
            named(access.identify(None, &bearer("sekrit"))),
            Ok(Some("default".into()))
        );
        assert_eq!(
            named(access.identify(None, &bearer("other"))),
            Err(AccessRefusal::Unauthorized)
        );
        assert_eq!(
            named(access.identify(None, &HeaderMap::new())),
            Err(AccessRefusal::Unauthorized)
        );
        let mut h = HeaderMap::new();
        h.insert("x-tenant", "gw-team".parse().expect("header"));
        assert_eq!(
            named(access.identify(ip("10.1.1.1"), &h)),
            Ok(Some("gw-team".into()))
        );
        assert_eq!(
            named(access.identify(ip("11.1.1.1"), &h)),
            Err(AccessRefusal::Unauthorized)
        );
        assert!(access.authorizes(&bearer("sekrit")) && !access.authorizes(&h));
        let open = Access::new(Some(""), None, None).expect("no key");
        assert_eq!(named(open.identify(None, &HeaderMap::new())), Ok(None));
        assert!(!open.requires_key() && access.requires_key());
        assert!(parse_max_tenant_labels("0").is_err() && parse_max_tenant_labels("32") == Ok(32));
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
                r#"{"tenants": [{"name": "a", "key": "k", "max_concurrent": 0}]}"#,
                "`max_concurrent` must be a positive integer",
            ),
            (
                r#"{"tenants": [{"name": "a", "key": "k", "tokens_per_minute": "lots"}]}"#,
                "`tokens_per_minute` must be a positive integer",
            ),
            (
                r#"{"tenants": [{"name": "other", "key": "k"}]}"#,
                "reserved",
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
