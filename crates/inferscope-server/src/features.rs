//! Which optional features a request used (log-probabilities, structured
//! outputs, tools): one small `Copy` value, read by the request log and
//! the request's span.

/// Which optional features a request used: worked out once per request
/// (from its validated plan) and copied into each choice's log entry and
/// the request's span, so finding "the requests with tools" or "the
/// constrained ones" needs no payload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestFeatures {
    /// Most likely tokens reported per generated token, when the request
    /// asked for log-probabilities (`logprobs`, `top_logprobs`).
    pub logprobs: Option<usize>,
    /// Most likely tokens reported per prompt position, when it asked for
    /// the prompt's (`prompt_logprobs`, or `echo` with `logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// The kind of structured output it was held to (`json`,
    /// `json_object`, `regex`, `choice`, `grammar`), if any.
    pub structured_output: Option<&'static str>,
    /// How many tools it offered the model (chat `tools`), when any.
    pub tools: Option<usize>,
    /// Its `tool_choice` (`none`, `auto`, `required`, or `function` for a
    /// named one; the default when omitted), when it offered tools.
    pub tool_choice: Option<&'static str>,
}
