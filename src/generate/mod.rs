//! Generation: options and replies, the sampler, the token loop, streamed text, the engine thread.
mod batch;
pub mod constraint;
pub mod engine;
pub mod generator;
pub mod kv_options;
pub mod options;
pub mod prompt_cache;
pub mod prompt_disk;
pub mod request;
pub mod sampler;
pub mod speculative;
pub mod text;

pub use options::{FinishReason, GenerateOptions, GenerateReply, GeneratedToken, Naming, SamplingConfig, TokenKind, TopLogprob, Usage};
pub use prompt_cache::PromptCacheConfig;
pub use kv_options::KvCacheOptions;
pub use constraint::ResponseFormat;
