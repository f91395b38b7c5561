//! The server's errors: [`ApiError`], answered to clients as OpenAI-style
//! bodies, and [`ServerError`], why the server cannot start.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered as `{"error":{"message","type","param","code"}}`.
///
/// `type` is always snake_case, as OpenAI's own (`invalid_request_error`,
/// `not_found_error`, ...): clients match on it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message naming the problem.
    pub message: String,
    /// OpenAI error type, snake_case (`invalid_request_error`, ...).
    pub kind: &'static str,
    /// The offending request field, if one.
    pub param: Option<&'static str>,
    /// Seconds for the `Retry-After` header of a 429 (a tenant's limit).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 409: the request conflicts with the server's state (retry later, or
    /// after the step `message` names).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::CONFLICT,
            message: message.into(),
            kind: "conflict_error",
            param: None,
            retry_after: None,
        }
    }

    /// 400: the request is malformed or out of range.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            retry_after: None,
        }
    }

    /// 404: the model is not served here.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist."),
            kind: "not_found_error",
            param: Some("model"),
            retry_after: None,
        }
    }

    /// 404: no such route, or a disabled one.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            retry_after: None,
        }
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self {
            status: StatusCode::UNAUTHORIZED,
            message: "Invalid or missing API key: send `Authorization: Bearer <key>`.".into(),
            kind: "authentication_error",
            param: None,
            retry_after: None,
        }
    }

    /// 429: admission control refused the request.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            retry_after: None,
        }
    }

    /// 429 with `Retry-After`: `tenant`'s own limit refused it.
    pub fn tenant_limit(rejection: &inferscope_tenants::TenantRejection, tenant: &str) -> Self {
        Self {
            retry_after: Some(rejection.retry_after().max(1)),
            ..Self::overloaded(rejection.message(tenant))
        }
    }

    /// 503: the engine cannot take requests (shutting down, dead).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            kind: "service_unavailable",
            param: None,
            retry_after: None,
        }
    }

    /// 500: the engine failed while generating.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "internal_server_error",
            param: None,
            retry_after: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        r
    }
}

/// A server that cannot start, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A flag value is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The model could not be loaded.
    #[error("cannot load model `{model}`")]
    Model {
        /// The `--model` value.
        model: String,
        /// Why.
        source: inferscope_model::ModelError,
    },
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] inferscope_engine::EngineError),
    /// The metrics system could not start.
    #[error("metrics: {0}")]
    Metrics(#[from] inferscope_metrics::ConfigError),
    /// The listener could not be bound or served.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind a constructor can produce is snake_case, as OpenAI's are.
    #[test]
    fn kinds_are_snake_case() {
        for e in [
            ApiError::invalid("x", None),
            ApiError::model_not_found("m"),
            ApiError::not_found("x"),
            ApiError::unauthorized(),
            ApiError::overloaded("x"),
            ApiError::unavailable("x"),
            ApiError::internal("x"),
        ] {
            assert!(
                e.kind.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{}",
                e.kind
            );
        }
    }
}
