//! What the integration test files share.

use std::sync::Arc;
use std::time::Instant;

use inferscope_engine::{EngineRequest, SamplingParams};

/// A request of `prompt` that generates exactly `max_tokens` (EOS ignored).
pub fn request(id: &str, prompt: Vec<u32>, max_tokens: usize) -> EngineRequest {
    EngineRequest {
        request_id: id.into(),
        prompt_token_ids: prompt,
        params: Arc::new(SamplingParams {
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        }),
        seed_offset: 0,
        arrival: Instant::now(),
        trace_id: None,
        tenant: None,
        tenant_label: 0,
        grammar: None,
    }
}
