//! (under construction)
/// Placeholder.
pub struct SimExecutor;
/// Placeholder.
pub struct SimProfile;
