//! `GET /metrics`: content negotiation and rendering of the registry in the
//! Prometheus text format 0.0.4 or OpenMetrics 1.0.0.

use prometheus_client::encoding::{prometheus_text, text};
use prometheus_client::registry::Registry;

use crate::exemplar::{self, ExemplarIndex};

/// `Content-Type` of the Prometheus text format 0.0.4.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// `Content-Type` of OpenMetrics 1.0.0.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// An exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Format {
    /// Prometheus text 0.0.4 (the default: every scraper reads it).
    #[default]
    Prometheus,
    /// OpenMetrics 1.0.0 text.
    OpenMetrics,
}

impl Format {
    /// The response `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Prometheus => PROMETHEUS_CONTENT_TYPE,
            Self::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// Picks the format from an `Accept` header: OpenMetrics when
/// `application/openmetrics-text` is acceptable with a quality at least as
/// high as anything else we could serve, else Prometheus text 0.0.4.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else {
        return Format::Prometheus;
    };
    let mut openmetrics_q: Option<f32> = None;
    let mut other_q: f32 = 0.0;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let mut q = 1.0_f32;
        for param in parts {
            if let Some((k, v)) = param.split_once('=')
                && k.trim().eq_ignore_ascii_case("q")
            {
                q = v.trim().parse().unwrap_or(0.0);
            }
        }
        match media.as_str() {
            "application/openmetrics-text" => {
                openmetrics_q = Some(openmetrics_q.map_or(q, |old| old.max(q)));
            }
            "text/plain" | "text/*" | "*/*" => other_q = other_q.max(q),
            _ => {}
        }
    }
    match openmetrics_q {
        Some(q) if q > 0.0 && q >= other_q => Format::OpenMetrics,
        _ => Format::Prometheus,
    }
}

/// Renders `registry` in `format`; returns the content type and the body.
pub fn render(registry: &Registry, format: Format) -> (&'static str, String) {
    render_with_exemplars(registry, format, &ExemplarIndex::default())
}

/// Renders `registry` in `format`, with the exemplars of `exemplars` when
/// the format is OpenMetrics (Prometheus text 0.0.4 has no syntax for them).
pub fn render_with_exemplars(
    registry: &Registry,
    format: Format,
    exemplars: &ExemplarIndex,
) -> (&'static str, String) {
    let mut body = String::with_capacity(64 * 1024);
    // Writing into a String cannot fail; an encoder error would come from a
    // metric's own encode impl, none of ours returns one.
    let result = match format {
        Format::Prometheus => prometheus_text::encode(&mut body, registry),
        Format::OpenMetrics => text::encode(&mut body, registry),
    };
    if let Err(err) = result {
        tracing::error!(?err, "encoding metrics failed");
    }
    if format == Format::OpenMetrics && !exemplars.is_empty() {
        body = exemplar::attach(&body, exemplars);
    }
    (format.content_type(), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(None), Format::Prometheus);
        assert_eq!(negotiate(Some("text/plain")), Format::Prometheus);
        assert_eq!(negotiate(Some("*/*")), Format::Prometheus);
        assert_eq!(
            negotiate(Some("application/openmetrics-text")),
            Format::OpenMetrics
        );
        // What Prometheus 2.x/3.x sends.
        assert_eq!(
            negotiate(Some(
                "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
            )),
            Format::OpenMetrics
        );
        assert_eq!(
            negotiate(Some(
                "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;q=0.5"
            )),
            Format::Prometheus
        );
        assert_eq!(
            negotiate(Some("application/openmetrics-text;q=0")),
            Format::Prometheus
        );
        assert_eq!(
            negotiate(Some("Application/OpenMetrics-Text; version=1.0.0")),
            Format::OpenMetrics
        );
    }
}
