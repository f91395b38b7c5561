//! Request ids. A request has two: the one its client sees (the client's
//! own `x-request-id`, else a fresh unpredictable one), echoed in the
//! response and the logs; and one engine id per choice, always unique in
//! the process, so that no client can make another client's request fail by
//! sending the same id (vLLM also suffixes client ids for this reason).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::HeaderMap;

/// Longest `x-request-id` taken from a client; a longer one is replaced.
pub const MAX_CLIENT_REQUEST_ID_BYTES: usize = 256;

/// Makes both kinds of id.
pub struct RequestIds {
    /// Engine ids end in this counter, so no two are equal.
    next: AtomicU64,
    /// A per-process random key: generated ids reveal nothing of the next.
    key: std::collections::hash_map::RandomState,
}

impl Default for RequestIds {
    fn default() -> Self {
        Self {
            next: AtomicU64::new(0),
            key: std::collections::hash_map::RandomState::new(),
        }
    }
}

impl RequestIds {
    /// The client's usable `x-request-id` (non-empty, at most
    /// [`MAX_CLIENT_REQUEST_ID_BYTES`]), else a fresh 128-bit random id.
    pub fn external(&self, headers: &HeaderMap) -> String {
        headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty() && v.len() <= MAX_CLIENT_REQUEST_ID_BYTES)
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let n = self.next.fetch_add(1, Ordering::Relaxed);
                let mut id = String::with_capacity(32);
                push_hex(&mut id, self.key.hash_one((n, 0u8)), 16);
                push_hex(&mut id, self.key.hash_one((n, 1u8)), 16);
                id
            })
    }

    /// A fresh engine id for one choice of the request `external`:
    /// `{external}-{n}` with `n` in hex, never used before in this process.
    /// Unique whatever `external` is: the part after the last `-` is `n`
    /// (hex has no `-`), and no two calls get the same `n`.
    pub fn engine_id(&self, external: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut id = String::with_capacity(external.len() + 17);
        id.push_str(external);
        id.push('-');
        push_hex(&mut id, n, 1);
        id
    }
}

/// Appends `n` in lower-case hex, zero-padded to `width` digits: what
/// `format!("{n:0width$x}")` writes, without the formatting machinery
/// (which cost more than the rest of making an id; every request makes two).
fn push_hex(out: &mut String, n: u64, width: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digits = (64 - n.leading_zeros() as usize).div_ceil(4).max(1);
    for _ in digits..width {
        out.push('0');
    }
    for i in (0..digits).rev() {
        out.push(DIGITS[(n >> (4 * i)) as usize & 0xf] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_id(id: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", id.parse().unwrap());
        h
    }

    #[test]
    fn client_ids_are_kept_and_engine_ids_never_repeat() {
        let ids = RequestIds::default();
        assert_eq!(ids.external(&with_id(" req-42 ")), "req-42");
        let a = ids.engine_id("req-42");
        let b = ids.engine_id("req-42");
        assert!(a.starts_with("req-42-") && b.starts_with("req-42-"));
        assert_ne!(a, b);
        // A client id shaped like another request's engine id still differs.
        let c = ids.engine_id(&a);
        assert_ne!(c, a);
        assert_ne!(c, b);
    }

    #[test]
    fn hex_is_what_format_writes() {
        for n in [0, 1, 9, 10, 15, 16, 255, 256, 0xabc, u64::MAX / 3, u64::MAX] {
            for width in [0, 1, 2, 16, 20] {
                let mut out = String::from("x");
                push_hex(&mut out, n, width);
                assert_eq!(out, format!("x{n:0width$x}"), "{n} {width}");
            }
        }
    }

    #[test]
    fn generated_ids_are_fresh_and_not_a_counter() {
        let ids = RequestIds::default();
        let too_long = "x".repeat(MAX_CLIENT_REQUEST_ID_BYTES + 1);
        let a = ids.external(&HeaderMap::new());
        let b = ids.external(&with_id(&too_long));
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        // Another process (another key) makes other ids from the same counter.
        assert_ne!(a, RequestIds::default().external(&HeaderMap::new()));
    }
}
