//! Chat-level types shared by the tokenizer (templates), the engine and the Node/CLI surfaces:
//! messages and tools, reasoning formats, tool-call formats, the streaming classifier that labels
//! generated text as text, reasoning or tool call (`stream`, over `reasoning` and `tools`), and
//! whole-reply parsing through that classifier (`parse`).
mod call_grammar;
pub mod audio_part;
pub mod generic;
pub mod media;
mod messages;
pub mod parse;
pub mod reasoning;
pub mod stream;
pub mod tool_choice;
pub mod tools;

pub use media::{ImageData, Media, MediaAccess, MessageImage};
pub use messages::{
    parse_messages_json, parse_messages_json_with, parse_tools_json, ChatMessage, ContentPart, FunctionDef, Role, Tool,
    ToolCall,
};
pub use parse::{parse_tool_calls, parse_tool_calls_any, parse_tool_calls_with_tools, split_reasoning, ParsedToolCalls, SplitReasoning};
pub use reasoning::ReasoningFormat;
pub use stream::{ClassifiedOutput, OutputClassifier, Segment, SpanKind};
pub use tool_choice::ToolChoice;
pub use tools::ToolCallFormat;
