//! The chat parsers of mlex, compiled on their own for fuzzing (see Cargo.toml). The files keep
//! their `super::` paths: here the crate root stands in for `mlex::chat`.
#![allow(dead_code, unused_imports, unreachable_patterns)]

pub mod error {
    /// The one variant of mlex's error type that src/chat/messages.rs uses.
    #[derive(Debug, thiserror::Error)]
    pub enum Error {
        #[error("invalid argument: {0}")]
        InvalidArgument(String),
    }
    pub type Result<T> = std::result::Result<T, Error>;
}

#[path = "../../src/chat/messages.rs"]
mod messages;
#[path = "../../src/chat/reasoning.rs"]
pub mod reasoning;
#[path = "../../src/chat/stream.rs"]
pub mod stream;
#[path = "../../src/chat/tools.rs"]
pub mod tools;

pub use messages::{ChatMessage, FunctionDef, Role, Tool, ToolCall};

/// The same names as `mlex::chat`.
pub mod chat {
    pub use super::reasoning::ReasoningFormat;
    pub use super::stream::{self, OutputClassifier, Part, Segment, SpanKind};
    pub use super::tools::{parse_tool_calls, parse_tool_calls_with_tools, ToolCallFormat};
    pub use super::{Tool, ToolCall};
}
