//! (under construction)
/// Placeholder.
pub struct Coordinator;
/// Placeholder.
pub struct RequestHandle;
/// Placeholder.
#[derive(Debug, thiserror::Error)]
#[error("engine error")]
pub struct EngineError;
