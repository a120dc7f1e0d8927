//! Chat-level types shared by the tokenizer (templates), the engine and the Node/CLI surfaces.
mod messages;

pub use messages::{
    parse_messages_json, parse_tools_json, ChatMessage, FunctionDef, Role, Tool, ToolCall,
};
