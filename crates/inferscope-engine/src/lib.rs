//! inferscope-engine: request lifecycle, scheduler, paged KV block pool with
//! prefix caching, the engine-core loop, the data-parallel coordinator, the
//! [`Executor`] seam and the simulated-accelerator executor.

pub mod bad_words;
pub mod block_pool;
pub mod config;
pub mod coordinator;
pub mod cost;
pub mod engine_core;
pub mod executor;
mod gbnf;
mod inbox;
pub mod kv_events;
pub mod kv_residency;
pub mod output_channel;
pub mod request;
pub mod scheduler;
pub mod sim;
pub mod step_trace;
mod structural_tag;
pub mod structured;
mod thread_policy;
mod waiting_queue;

pub use bad_words::BadWords;
pub use config::EngineConfig;
pub use coordinator::{Coordinator, EngineError, RequestHandle};
pub use cost::ModelCost;
pub use executor::{
    Executor, ExecutorError, LogprobRow, PromptRows, ScheduledBatch, ScheduledSeq, SeqHistory,
    StepCost, StepOutput,
};
pub use inferscope_schema::FinishReason;
pub use kv_events::{KvEvent, KvEventBatch, KvEventSink};
pub use request::{
    EngineRequest, FinishedOutput, PositionLogprobs, PrefillChunk, RequestOutput, RequestTimeline,
    SamplingParams, StopTokenIds,
};
pub use sim::{SimExecutor, SimProfile};
pub use step_trace::{EngineProfile, RequestTrace, StepRecord, StepRing, StepSeq};
pub use structured::{CompiledGrammar, GrammarCompiler, GrammarError, StructuredOutput, TokenMask};
pub use waiting_queue::SchedulingPolicy;
