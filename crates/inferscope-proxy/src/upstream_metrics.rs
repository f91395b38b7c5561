//! `--upstream-metrics`: the upstream's own exposition fetched at each scrape
//! and appended to the proxy's, without the families whose names collide.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Uri, header};
use http_body_util::{BodyExt, Limited};

use crate::upstream::{self, BaseUrl, UpstreamClient};

/// How long a scrape of the upstream's `/metrics` may take.
pub(crate) const UPSTREAM_METRICS_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest upstream exposition re-exposed.
pub(crate) const MAX_UPSTREAM_METRICS: usize = 64 * 1024 * 1024;

pub(crate) async fn fetch_upstream_metrics(
    client: &UpstreamClient,
    base: &BaseUrl,
    url: &Uri,
) -> Result<String, String> {
    let mut req = http::Request::get(url.clone())
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    req.headers_mut().insert(
        header::ACCEPT,
        HeaderValue::from_static("text/plain;version=0.0.4"),
    );
    let resp = upstream::send(client, base, req, UPSTREAM_METRICS_TIMEOUT)
        .await
        .map_err(|f| format!("{f:?}"))?;
    if !resp.status().is_success() {
        return Err(format!("{url} answered {}", resp.status()));
    }
    let body = tokio::time::timeout(
        UPSTREAM_METRICS_TIMEOUT,
        Limited::new(resp.into_body(), MAX_UPSTREAM_METRICS).collect(),
    )
    .await
    .map_err(|_| format!("{url} did not finish its body in time"))?
    .map_err(|e| format!("reading {url}: {e}"))?
    .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| format!("{url} sent a body that is not UTF-8"))
}

/// The family a sample or metadata line belongs to.
pub(crate) fn line_family(line: &str) -> Option<&str> {
    if let Some(meta) = line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
        .or_else(|| line.strip_prefix("# UNIT "))
    {
        return meta.split_whitespace().next();
    }
    if line.starts_with('#') {
        return None;
    }
    line.split(['{', ' ', '\t'])
        .next()
        .filter(|n| !n.is_empty())
}

/// Appends the upstream's lines to `own`, leaving out `# EOF` and the
/// families `own` already has (two families of one name break a scrape);
/// returns the names left out.
pub fn append_upstream(own: &mut String, upstream: &str) -> Vec<String> {
    let mine: std::collections::HashSet<String> = own
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let taken = |name: &str| {
        mine.contains(name)
            || ["_bucket", "_sum", "_count", "_total", "_created"]
                .iter()
                .filter_map(|s| name.strip_suffix(s))
                .any(|base| mine.contains(base))
    };
    let mut dropped = std::collections::BTreeSet::new();
    let mut kept = String::with_capacity(upstream.len());
    for line in upstream.lines() {
        if line.trim() == "# EOF" {
            continue;
        }
        match line_family(line) {
            Some(name) if taken(name) => {
                dropped.insert(name.to_owned());
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    own.push_str(&kept);
    dropped.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_exposition_appended_without_collisions() {
        let mut own = "# HELP http_requests Total.\n# TYPE http_requests counter\nhttp_requests_total{handler=\"/v1/models\"} 1\n".to_owned();
        let upstream = "# HELP http_requests Total.\n# TYPE http_requests counter\nhttp_requests_total{handler=\"x\"} 9\n# HELP llamacpp:tokens_predicted_total n\n# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 42\n# EOF\n";
        assert_eq!(
            append_upstream(&mut own, upstream),
            ["http_requests", "http_requests_total"]
        );
        assert_eq!(
            own.matches("# TYPE http_requests counter").count(),
            1,
            "{own}"
        );
        assert!(!own.contains("handler=\"x\""), "{own}");
        assert!(
            own.contains("llamacpp:tokens_predicted_total 42\n"),
            "{own}"
        );
        assert!(!own.contains("# EOF"), "{own}");
    }
}
