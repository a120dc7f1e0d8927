//! The chat parsers of mlex, compiled on their own for fuzzing (see Cargo.toml).
#![allow(dead_code, unused_imports)]

pub mod error {
    /// The one variant of mlex's error type that src/chat/messages.rs uses.
    #[derive(Debug, thiserror::Error)]
    pub enum Error {
        #[error("invalid argument: {0}")]
        InvalidArgument(String),
    }
    pub type Result<T> = std::result::Result<T, Error>;
}

pub mod chat {
    #[path = "../../../src/chat/messages.rs"]
    mod messages;
    #[path = "../../../src/chat/reasoning.rs"]
    pub mod reasoning;
    #[path = "../../../src/chat/stream.rs"]
    pub mod stream;
    #[path = "../../../src/chat/tools.rs"]
    pub mod tools;

    pub use messages::{ChatMessage, FunctionDef, Role, Tool, ToolCall};
    pub use reasoning::ReasoningFormat;
    pub use stream::{OutputClassifier, Segment, SpanKind};
    pub use tools::{parse_tool_calls, parse_tool_calls_with_tools, ToolCallFormat};
}
