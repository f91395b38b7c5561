//! The `model_name` labels: the names given with `--served-model-name`, or
//! those the upstream lists at `/v1/models`, bounded (the rest are `other`).

use std::time::Duration;

use axum::body::Body;
use http_body_util::{BodyExt, Limited};
use inferscope_metrics::FrontendRecorder;

use crate::upstream::{self, BaseUrl, UpstreamClient};

/// Models given their own series at most; more share the `other` series.
pub const MAX_MODELS: usize = 32;
/// The `model_name` of requests for a model outside the known set.
pub const OTHER_MODEL: &str = "other";

/// The models the upstream lists at `/v1/models`, in its order.
pub(crate) async fn discover_models(client: &UpstreamClient, base: &BaseUrl) -> Vec<String> {
    let listed = async {
        let uri = base.join("/v1/models").ok()?;
        let req = http::Request::get(uri).body(Body::empty()).ok()?;
        let resp = upstream::send(client, base, req, Duration::from_secs(10))
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = Limited::new(resp.into_body(), 4 * 1024 * 1024)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let ids = v
            .get("data")?
            .as_array()?
            .iter()
            .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
            .collect::<Vec<_>>();
        Some(ids)
    };
    listed.await.unwrap_or_default()
}

/// The series of each model the proxy labels requests with: a fixed set
/// chosen at start-up (`--served-model-name`, else the upstream's
/// `/v1/models`), so a client cannot create series by inventing names.
pub struct ModelSeries {
    /// Each model's recorder (a clone per request is one `Arc` increment).
    pub(crate) known: Vec<FrontendRecorder>,
    /// The only model (every request is labelled with it, whatever its
    /// `model` says: single-model servers ignore the field), or `other`.
    pub(crate) fallback: FrontendRecorder,
}

impl ModelSeries {
    /// The recorder of a request for `model`.
    pub fn for_request(&self, model: Option<&str>) -> &FrontendRecorder {
        model
            .and_then(|m| self.known.iter().find(|e| e.model_name() == m))
            .unwrap_or(&self.fallback)
    }
}

/// The `model_name`s to keep series for, from the flag or the upstream.
pub(crate) fn model_names(given: &[String], listed: Vec<String>, upstream: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let source = if given.is_empty() {
        listed
    } else {
        given.to_vec()
    };
    for name in source {
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    if names.len() > MAX_MODELS {
        tracing::warn!(
            models = names.len(),
            kept = MAX_MODELS,
            "more models than the proxy keeps series for: requests for the rest are labelled model_name=\"other\" (name the ones to keep with --served-model-name)"
        );
        names.truncate(MAX_MODELS);
    }
    if names.is_empty() {
        tracing::warn!(
            upstream,
            "the upstream listed no model at /v1/models: labelling metrics model_name=\"unknown\" (set --served-model-name)"
        );
        names.push("unknown".to_owned());
    }
    names
}
