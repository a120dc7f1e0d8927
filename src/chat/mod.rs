//! Chat-level types shared by the tokenizer (templates), the engine and the Node/CLI surfaces:
//! messages and tools, reasoning spans, tool-call parsing, and the streaming classifier that
//! labels generated text as text, reasoning or tool call.
mod messages;
pub mod reasoning;
pub mod stream;
pub mod tools;

pub use messages::{
    parse_messages_json, parse_tools_json, ChatMessage, FunctionDef, Role, Tool, ToolCall,
};
pub use reasoning::{split_reasoning, ReasoningFormat, SplitReasoning};
pub use stream::{ClassifiedOutput, OutputClassifier, Segment, SpanKind};
pub use tools::{parse_tool_calls, parse_tool_calls_with_tools, ParsedToolCalls, ToolCallFormat};
