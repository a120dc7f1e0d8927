//! mlex: run local LLMs on Apple's MLX from Rust, Node.js and the command line.
//!
//! One Rust core over MLX's C++ API (through our own flat C shim), three backends (Metal, CUDA,
//! CPU). Start with [`Session`]: load a checkpoint, then generate from chat messages.
//!
//! ```no_run
//! use mlex::{ChatMessage, GenerateOptions, Session};
//! let session = Session::load("models/SmolLM2-135M-Instruct")?;
//! let reply = session.generate_cached(
//!     &[ChatMessage::user("What is the capital of France?")],
//!     None,
//!     GenerateOptions { max_tokens: 32, ..Default::default() },
//!     |tok| { print!("{}", tok.text); true },
//! )?;
//! println!("\n{:?} {:.1} tok/s", reply.finish_reason, reply.usage.decode_tokens_per_second);
//! # Ok::<(), mlex::Error>(())
//! ```
pub mod ablation;
pub mod bench;
pub mod chat;
pub mod convert;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod loader;
pub mod media;
pub mod mlx;
pub mod models;
pub mod nn;
pub mod schema;
pub mod startup_trace;
#[cfg(feature = "serve")]
pub mod serve;
#[cfg(feature = "node")]
mod node;
mod session;
pub mod tokenizer;

pub use chat::{ChatMessage, Role, Tool, ToolCall};
pub use error::{Error, Result};
pub use generate::{FinishReason, GenerateOptions, GenerateReply, GeneratedToken, KvCacheOptions, SamplingConfig, TokenKind, TopLogprob, Usage};
pub use mlx::{Device, Dtype};
pub use generate::PromptCacheConfig;
pub use generate::engine::{Event, Sink};
pub use session::{Generation, LoadOptions, ModelInfo, Request, Session};
