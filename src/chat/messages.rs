//! OpenAI-style chat messages and tool definitions, (de)serialized in the shapes OpenAI clients
//! send, so `--messages FILE.json` and the Node API can take a request body as it is.
use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::media::{image_from_part, is_image_part, is_video_part, video_from_part, MediaAccess, MessageImage};
use crate::error::{Error, Result};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unknown message role {other:?} (expected system, developer, user, assistant or tool)"
                )))
            }
        })
    }
}

impl<'de> Deserialize<'de> for Role {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|e: Error| de::Error::custom(strip_prefix(&e)))
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    pub role: Role,
    /// The text; content parts are joined on input, `null` becomes "".
    pub content: String,
    /// Image, video and audio parts, each at its byte offset in `content` (in order).
    pub images: Vec<MessageImage>,
    /// The model's thinking, for templates that re-render it (`reasoning_content`).
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// For `role: tool`: which call this result answers.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

impl ChatMessage {
    /// The content as parts, text, images, videos and audio in order (empty text left out), as
    /// Hugging Face chat templates read it: `{"type": "text", "text"}`, `{"type": "image"}`,
    /// `{"type": "video"}` and `{"type": "audio"}` (with `with_data`, the image as an OpenAI
    /// `image_url` data URL instead, the video with its frames as data URLs, the audio clip as a
    /// data URL in `audio`).
    pub fn content_parts_json(&self, with_data: bool) -> Value {
        use base64::Engine as _;
        let mut parts = vec![];
        let mut from = 0;
        for img in &self.images {
            let at = img.at.min(self.content.len());
            if at > from {
                parts.push(serde_json::json!({"type": "text", "text": &self.content[from..at]}));
            }
            from = at.max(from);
            let url = |bytes: &[u8]| {
                format!("data:application/octet-stream;base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
            };
            if img.audio {
                parts.push(if with_data {
                    serde_json::json!({"type": "audio", "audio": url(&img.image.bytes)})
                } else {
                    serde_json::json!({"type": "audio"})
                });
                continue;
            }
            if let Some(frames) = &img.video {
                parts.push(if with_data {
                    let mut v = serde_json::json!({"type": "video", "video": frames.iter().map(|f| url(&f.bytes)).collect::<Vec<_>>()});
                    // A decoded video's frames keep their times (read back by `video_from_part`).
                    if frames.iter().all(|f| f.time.is_some()) {
                        v["frame_times"] = frames.iter().map(|f| f.time.map(|t| serde_json::json!(t))).collect();
                    }
                    v
                } else {
                    serde_json::json!({"type": "video"})
                });
                continue;
            }
            parts.push(if with_data {
                let data = base64::engine::general_purpose::STANDARD.encode(&img.image.bytes);
                serde_json::json!({"type": "image_url", "image_url": {"url": format!("data:application/octet-stream;base64,{data}")}})
            } else {
                serde_json::json!({"type": "image"})
            });
        }
        if from < self.content.len() {
            parts.push(serde_json::json!({"type": "text", "text": &self.content[from..]}));
        }
        Value::Array(parts)
    }

    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            images: Vec::new(),
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn developer(content: impl Into<String>) -> Self {
        Self::new(Role::Developer, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
    /// A tool result answering the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { tool_call_id: Some(tool_call_id.into()), ..Self::new(Role::Tool, content) }
    }
    pub fn assistant_with_reasoning(content: impl Into<String>, reasoning: impl Into<String>) -> Self {
        ChatMessage { reasoning: Some(reasoning.into()), ..Self::assistant(content) }
    }
    /// A user message of `parts`, in order: text, or an image.
    pub fn user_with_images(parts: Vec<ContentPart>) -> Self {
        let mut m = Self::user("");
        for p in parts {
            match p {
                ContentPart::Text(t) => m.content.push_str(&t),
                ContentPart::Image(image) => m.images.push(MessageImage::image(m.content.len(), image)),
                ContentPart::Video(frames) if !frames.is_empty() => m.images.push(MessageImage::video(m.content.len(), frames)),
                ContentPart::Video(_) => {}
                ContentPart::Audio(clip) => m.images.push(MessageImage::audio(m.content.len(), clip)),
            }
        }
        m
    }
    pub fn assistant_with_tool_calls(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Self {
        ChatMessage { tool_calls, ..Self::assistant(content) }
    }
}

/// A tool the model may call (OpenAI `{"type": "function", "function": {...}}`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

impl Tool {
    pub fn function(name: impl Into<String>, description: Option<String>, parameters: Value) -> Self {
        Tool {
            kind: "function".into(),
            function: FunctionDef { name: name.into(), description, parameters },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionDef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments; `Null` when the tool declared none.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub parameters: Value,
}

/// A call the assistant made. `arguments` is parsed JSON (OpenAI sends it as a JSON string).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

impl ToolCall {
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        ToolCall { id: id.into(), name: name.into(), arguments }
    }

    /// The OpenAI object with `arguments` kept as a JSON value (what chat templates expect).
    pub fn to_template_value(&self) -> Value {
        self.openai_value(self.arguments.clone())
    }

    fn openai_value(&self, arguments: Value) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), Value::String(self.name.clone()));
        function.insert("arguments".into(), arguments);
        let mut call = Map::new();
        call.insert("id".into(), Value::String(self.id.clone()));
        call.insert("type".into(), Value::String("function".into()));
        call.insert("function".into(), Value::Object(function));
        Value::Object(call)
    }
}

/// A part of a message's content.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentPart {
    Text(String),
    Image(super::media::ImageData),
    /// A video as its frames (each an image), in order; an empty one is left out. An animated
    /// GIF, WebP or PNG becomes its timed frames through [`super::media::animated_video`] (bytes)
    /// or [`super::media::video_from_path`] (a file).
    Video(Vec<super::media::ImageData>),
    /// An audio clip's encoded bytes (WAV, FLAC or MP3).
    Audio(super::media::ImageData),
}

/// Parses `--messages FILE.json`: a bare array of messages or `{"messages": [...]}`. Image parts
/// may name local files (the caller's own): see [`parse_messages_json_with`].
pub fn parse_messages_json(text: &str) -> Result<Vec<ChatMessage>> {
    parse_messages_json_with(text, MediaAccess::LocalFiles)
}

/// [`parse_messages_json`], image parts reading only what `access` allows.
pub fn parse_messages_json_with(text: &str, access: MediaAccess) -> Result<Vec<ChatMessage>> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::InvalidArgument(format!("messages are not valid JSON: {e}")))?;
    let list = match value {
        Value::Array(_) => value,
        Value::Object(mut obj) => match obj.remove("messages") {
            Some(list @ Value::Array(_)) => list,
            _ => {
                return Err(Error::InvalidArgument(
                    "expected a JSON array of messages or an object with a \"messages\" array".into(),
                ))
            }
        },
        _ => {
            return Err(Error::InvalidArgument(
                "expected a JSON array of messages or an object with a \"messages\" array".into(),
            ))
        }
    };
    let Value::Array(items) = list else { unreachable!() };
    let messages = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| message_from_value(item, access).map_err(|e| prefix_index("message", i, e)))
        .collect::<Result<Vec<_>>>()?;
    check_tool_results(&messages)?;
    Ok(messages)
}

/// A tool result whose `tool_call_id` names none of the calls the assistant made earlier in the
/// conversation answers nothing (OpenAI refuses it too). Results without an id are matched by
/// position, and a conversation with no earlier calls (history cut short) is left alone.
fn check_tool_results(messages: &[ChatMessage]) -> Result<()> {
    let mut ids: Vec<&str> = vec![];
    for (i, m) in messages.iter().enumerate() {
        ids.extend(m.tool_calls.iter().map(|c| c.id.as_str()).filter(|id| !id.is_empty()));
        if m.role != Role::Tool {
            continue;
        }
        if let Some(id) = m.tool_call_id.as_deref() {
            if !ids.is_empty() && !ids.contains(&id) {
                return Err(invalid(format!(
                    "message {i}: tool_call_id {id:?} matches no earlier tool call (ids: {})",
                    ids.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// Parses a tools list: a bare array or `{"tools": [...]}`.
pub fn parse_tools_json(text: &str) -> Result<Vec<Tool>> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::InvalidArgument(format!("tools are not valid JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        Value::Object(mut obj) if obj.contains_key("tools") => match obj.remove("tools") {
            Some(Value::Array(items)) => items,
            _ => return Err(Error::InvalidArgument("\"tools\" must be an array".into())),
        },
        _ => return Err(Error::InvalidArgument("expected a JSON array of tools".into())),
    };
    let tools = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| tool_from_value(item).map_err(|e| prefix_index("tool", i, e)))
        .collect::<Result<Vec<_>>>()?;
    // Two tools of one name: a call could not say which it means.
    for (i, t) in tools.iter().enumerate() {
        if let Some(j) = tools[..i].iter().position(|u| u.function.name == t.function.name) {
            return Err(invalid(format!("tool {i}: duplicate tool name {:?} (tool {j} has it too)", t.function.name)));
        }
    }
    Ok(tools)
}

fn prefix_index(what: &str, i: usize, e: Error) -> Error {
    Error::InvalidArgument(format!("{what} {i}: {}", strip_prefix(&e)))
}

/// Our InvalidArgument messages without the "invalid argument: " prefix Display adds.
fn strip_prefix(e: &Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.clone(),
        other => other.to_string(),
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

fn message_from_value(value: Value, access: MediaAccess) -> Result<ChatMessage> {
    let Value::Object(mut obj) = value else {
        return Err(invalid("a message must be a JSON object"));
    };
    let role = match obj.remove("role") {
        Some(Value::String(s)) => s.parse::<Role>()?,
        Some(_) => return Err(invalid("\"role\" must be a string")),
        None => return Err(invalid("missing \"role\"")),
    };
    let (content, images) = content_from_value(obj.remove("content").unwrap_or(Value::Null), access)?;
    let reasoning = match (obj.remove("reasoning"), obj.remove("reasoning_content")) {
        (Some(a), _) if !a.is_null() => Some(string_field("reasoning", a)?),
        (_, Some(b)) if !b.is_null() => Some(string_field("reasoning_content", b)?),
        _ => None,
    };
    let tool_calls = match obj.remove("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                tool_call_from_value(c)
                    .map_err(|e| invalid(format!("tool_calls[{i}]: {}", strip_prefix(&e))))
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(invalid("\"tool_calls\" must be an array")),
    };
    let tool_call_id = optional_string(&mut obj, "tool_call_id")?;
    let name = optional_string(&mut obj, "name")?;
    Ok(ChatMessage { role, content, images, reasoning, tool_calls, tool_call_id, name })
}

fn string_field(field: &str, v: Value) -> Result<String> {
    match v {
        Value::String(s) => Ok(s),
        _ => Err(invalid(format!("\"{field}\" must be a string"))),
    }
}

fn optional_string(obj: &mut Map<String, Value>, field: &str) -> Result<Option<String>> {
    match obj.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => string_field(field, v).map(Some),
    }
}

/// `content` may be a string, null, or OpenAI content parts; text parts are joined with no
/// separator (as mlx-lm's server does), image parts are kept at their place in the text.
fn content_from_value(v: Value, access: MediaAccess) -> Result<(String, Vec<MessageImage>)> {
    match v {
        Value::Null => Ok((String::new(), vec![])),
        Value::String(s) => Ok((s, vec![])),
        Value::Array(parts) => {
            let mut text = String::new();
            let mut images = vec![];
            for (i, part) in parts.into_iter().enumerate() {
                match part {
                    Value::String(s) => text.push_str(&s),
                    Value::Object(p) => {
                        let kind = p.get("type").and_then(Value::as_str).unwrap_or("text");
                        match kind {
                            "text" | "input_text" => match p.get("text") {
                                Some(Value::String(s)) => text.push_str(s),
                                _ => return Err(invalid("a text content part needs a string \"text\"")),
                            },
                            kind if is_image_part(kind) => {
                                let image = image_from_part(&p, access)
                                    .map_err(|e| invalid(format!("content part {i}: {}", strip_prefix(&e))))?;
                                images.push(MessageImage::image(text.len(), image));
                            }
                            kind if is_video_part(kind) => {
                                let frames = video_from_part(&p, access)
                                    .map_err(|e| invalid(format!("content part {i} (video): {}", strip_prefix(&e))))?;
                                images.push(MessageImage::video(text.len(), frames));
                            }
                            kind if super::audio_part::is_audio_part(kind) => {
                                let clip = super::audio_part::audio_from_part(&p, access)
                                    .map_err(|e| invalid(format!("content part {i} (audio): {}", strip_prefix(&e))))?;
                                images.push(MessageImage::audio(text.len(), clip));
                            }
                            other => {
                                return Err(invalid(format!(
                                    "unsupported content part type {other:?} (text, image, video and audio parts are)"
                                )))
                            }
                        }
                    }
                    _ => return Err(invalid("content parts must be objects")),
                }
            }
            Ok((text, images))
        }
        _ => Err(invalid("\"content\" must be a string, null or an array of content parts")),
    }
}

/// Accepts the OpenAI shape `{id, type: "function", function: {name, arguments}}` and the flat
/// `{id, name, arguments}`; `arguments` may be a JSON string or a JSON value.
fn tool_call_from_value(v: Value) -> Result<ToolCall> {
    let Value::Object(mut obj) = v else {
        return Err(invalid("a tool call must be a JSON object"));
    };
    if let Some(kind) = obj.get("type").and_then(Value::as_str) {
        if kind != "function" {
            return Err(invalid(format!("unsupported tool call type {kind:?} (only \"function\")")));
        }
    }
    let id = optional_string(&mut obj, "id")?.unwrap_or_default();
    let mut func = match obj.remove("function") {
        Some(Value::Object(f)) => f,
        Some(_) => return Err(invalid("\"function\" must be an object")),
        None => obj,
    };
    let name = optional_string(&mut func, "name")?.ok_or_else(|| invalid("missing function \"name\""))?;
    let arguments = match func.remove("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
        // Models sometimes emit arguments that are not JSON; keep the raw text rather than fail.
        Some(Value::String(s)) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        Some(other) => other,
    };
    Ok(ToolCall { id, name, arguments })
}

/// Accepts `{type: "function", function: {...}}` and a bare `{name, description, parameters}`.
fn tool_from_value(v: Value) -> Result<Tool> {
    let Value::Object(mut obj) = v else {
        return Err(invalid("a tool must be a JSON object"));
    };
    let kind = optional_string(&mut obj, "type")?.unwrap_or_else(|| "function".into());
    if kind != "function" {
        return Err(invalid(format!("unsupported tool type {kind:?} (only \"function\")")));
    }
    let func = match obj.remove("function") {
        Some(f) => f,
        None => Value::Object(obj),
    };
    let function: FunctionDef = serde_json::from_value(func)
        .map_err(|e| invalid(format!("invalid function definition: {e}")))?;
    if function.name.trim().is_empty() {
        return Err(invalid("function \"name\" is empty"));
    }
    // The JSON Schema of the arguments: an object (or absent).
    if !matches!(function.parameters, Value::Null | Value::Object(_)) {
        return Err(invalid(format!(
            "function {:?}: \"parameters\" must be a JSON Schema object, got {}",
            function.name, function.parameters
        )));
    }
    Ok(Tool { kind, function })
}

impl<'de> Deserialize<'de> for ChatMessage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        // Deserialized messages come from wire formats: images inline only.
        message_from_value(Value::deserialize(d)?, MediaAccess::InlineOnly).map_err(|e| de::Error::custom(strip_prefix(&e)))
    }
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        tool_call_from_value(Value::deserialize(d)?).map_err(|e| de::Error::custom(strip_prefix(&e)))
    }
}

impl<'de> Deserialize<'de> for Tool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        tool_from_value(Value::deserialize(d)?).map_err(|e| de::Error::custom(strip_prefix(&e)))
    }
}

/// OpenAI wire shape: `arguments` as a JSON string.
impl Serialize for ToolCall {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let args = match &self.arguments {
            Value::String(raw) => raw.clone(),
            v => v.to_string(),
        };
        self.openai_value(Value::String(args)).serialize(s)
    }
}

/// OpenAI wire shape; optional fields are left out rather than written as null.
impl Serialize for ChatMessage {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("role", &self.role)?;
        if self.images.is_empty() {
            m.serialize_entry("content", &self.content)?;
        } else {
            m.serialize_entry("content", &self.content_parts_json(true))?;
        }
        if let Some(r) = &self.reasoning {
            m.serialize_entry("reasoning", r)?;
        }
        if !self.tool_calls.is_empty() {
            m.serialize_entry("tool_calls", &self.tool_calls)?;
        }
        if let Some(id) = &self.tool_call_id {
            m.serialize_entry("tool_call_id", id)?;
        }
        if let Some(n) = &self.name {
            m.serialize_entry("name", n)?;
        }
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_shapes() {
        let msgs = parse_messages_json(
            r#"[{"role":"system","content":"s"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                {"role":"assistant","content":null}]"#,
        )
        .unwrap();
        assert_eq!(msgs[0], ChatMessage::system("s"));
        assert_eq!(msgs[1].content, "ab");
        assert_eq!(msgs[2], ChatMessage::assistant(""));
    }

    #[test]
    fn wrapped_messages_object() {
        let msgs = parse_messages_json(r#"{"model":"x","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(msgs, vec![ChatMessage::user("hi")]);
        assert!(parse_messages_json(r#"{"msgs":[]}"#).is_err());
        assert!(parse_messages_json("[").is_err());
    }

    #[test]
    fn video_parts() {
        use crate::chat::media::MediaAccess;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f1.png");
        std::fs::write(&file, b"efgh").unwrap();
        let json = json!([{"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image", "image": "data:image/png;base64,YWJjZA=="},
            {"type": "video", "video": ["data:image/png;base64,YWJjZA==", file.display().to_string()]},
            {"type": "text", "text": "b"}]}]);
        let m = &parse_messages_json(&json.to_string()).unwrap()[0];
        assert_eq!((m.content.as_str(), m.images.len()), ("ab", 2));
        assert!(m.images[0].video.is_none());
        let frames: Vec<&[u8]> = m.images[1].video.as_ref().unwrap().iter().map(|f| &f.bytes[..]).collect();
        assert_eq!((m.images[1].at, frames), (1, vec![&b"abcd"[..], b"efgh"]));
        assert_eq!(m.content_parts_json(false), json!([{"type": "text", "text": "a"}, {"type": "image"}, {"type": "video"},
            {"type": "text", "text": "b"}]));
        let back: ChatMessage = serde_json::from_value(serde_json::to_value(m).unwrap()).unwrap();
        assert_eq!(&back, m);
        assert!(back.images[1].video.as_ref().unwrap().iter().all(|f| f.time.is_none()));
        // The server: frames inline only. A video file: refused, naming the part.
        let bad = |part: serde_json::Value, access: MediaAccess| {
            let json = json!([{"role": "user", "content": [{"type": "text", "text": "x"}, part]}]);
            parse_messages_json_with(&json.to_string(), access).unwrap_err()
        };
        let e = bad(json!({"type": "video", "video": [file.display().to_string()]}), MediaAccess::InlineOnly);
        assert!(e.to_string().contains("content part 1 (video): frame 0: images must be sent inline"), "{e}");
        let e = bad(json!({"type": "video", "video": "clip.mp4"}), MediaAccess::LocalFiles);
        assert_eq!(e.code(), "INVALID_ARGUMENT");
        assert!(e.to_string().contains("content part 1 (video): this is a MP4 video file, and mlex decodes no video codecs"), "{e}");
        // An MP4 by its content (bytes arrive from JavaScript as octet-stream data: URLs).
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mp4 = format!("data:application/octet-stream;base64,{}", b64(b"\0\0\0\x20ftypisom\0\0\x02\0isomiso2avc1mp41"));
        let e = bad(json!({"type": "video", "video": mp4}), MediaAccess::InlineOnly);
        assert!(e.to_string().contains("content part 1 (video): this is a MP4/MOV video file"), "{e}");
        let e = bad(json!({"type": "video_url", "video_url": {"url": "data:video/webm;base64,GkXfow=="}}), MediaAccess::InlineOnly);
        assert!(e.to_string().contains("WEBM video file, and mlex decodes no video codecs"), "{e}");
        // An animated GIF: its frames, timed; inline, from a file (OpenAI's {url} shape too).
        let frame = |c: u8| image::Frame::from_parts(image::RgbaImage::from_pixel(4, 4, image::Rgba([c, 0, 0, 255])), 0, 0,
            image::Delay::from_numer_denom_ms(500, 1));
        let mut gif = vec![];
        image::codecs::gif::GifEncoder::new(&mut gif).encode_frames([frame(0), frame(200), frame(90)]).unwrap();
        let path = dir.path().join("anim.gif");
        std::fs::write(&path, &gif).unwrap();
        let inline = format!("data:image/gif;base64,{}", b64(&gif));
        for (part, access) in [
            (json!({"type": "video", "video": inline}), MediaAccess::InlineOnly),
            (json!({"type": "video_url", "video_url": {"url": inline}}), MediaAccess::InlineOnly),
            (json!({"type": "video", "video": path.display().to_string()}), MediaAccess::LocalFiles),
        ] {
            let json = json!([{"role": "user", "content": [part]}]);
            let m = parse_messages_json_with(&json.to_string(), access).unwrap();
            let v = m[0].images[0].video.as_ref().unwrap();
            let times: Vec<_> = v.iter().map(|f| f.time.unwrap()).collect();
            assert_eq!(times, [[0.0, 0.5], [0.5, 1.0], [1.0, 1.5]]);
            assert_eq!(crate::chat::media::video_times(v), Some((vec![0.0, 0.5, 1.0], 1.5)));
            // Serialized and read back, the frames keep their times.
            let back: Vec<ChatMessage> = serde_json::from_value(serde_json::to_value(&m).unwrap()).unwrap();
            let bv = back[0].images[0].video.as_ref().unwrap();
            assert_eq!((bv, bv.iter().map(|f| f.time.unwrap()).collect::<Vec<_>>()), (v, times));
        }
        let e = bad(json!({"type": "video", "video": ["data:image/png;base64,YWJjZA=="], "frame_times": [[1.0, 0.5]]}), MediaAccess::InlineOnly);
        assert!(e.to_string().contains("frame_times"), "{e}");
        // The server reads no file, even for a video.
        let e = bad(json!({"type": "video", "video": path.display().to_string()}), MediaAccess::InlineOnly);
        assert!(e.to_string().contains("content part 1 (video): images must be sent inline"), "{e}");
        // A still image is a one-frame video; a truncated GIF and garbage are refused.
        let png = format!("data:image/png;base64,{}", b64(&{
            let mut c = std::io::Cursor::new(vec![]);
            image::DynamicImage::ImageRgb8(image::RgbImage::new(3, 3)).write_to(&mut c, image::ImageFormat::Png).unwrap();
            c.into_inner()
        }));
        let json = json!([{"role": "user", "content": [{"type": "video", "video": png}]}]);
        let m = parse_messages_json_with(&json.to_string(), MediaAccess::InlineOnly).unwrap();
        assert_eq!(m[0].images[0].video.as_ref().map(|v| (v.len(), v[0].time)), Some((1, Some([0.0, 0.0]))));
        let cut = format!("data:image/gif;base64,{}", b64(&gif[..gif.len() - 20]));
        let e = bad(json!({"type": "video", "video": cut}), MediaAccess::InlineOnly);
        assert!(e.code() == "INVALID_ARGUMENT" && e.to_string().contains("content part 1 (video): cannot decode frame"), "{e}");
    }

    #[test]
    fn image_parts() {
        use crate::chat::media::MediaAccess;
        // Inline (base64 of the 4 bytes "abcd": decoding is the model's business), a file, a
        // path, each at its place in the text.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pic.png");
        std::fs::write(&file, b"efgh").unwrap();
        let json = json!([{"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,YWJjZA=="}},
            {"type": "text", "text": "b"},
            {"type": "image", "image": format!("file://{}", file.display())},
            {"type": "input_image", "image_url": file.display().to_string()},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "YWJjZA=="}}]}]);
        let m = &parse_messages_json(&json.to_string()).unwrap()[0];
        assert_eq!(m.content, "ab");
        let got: Vec<(usize, &[u8])> = m.images.iter().map(|i| (i.at, &i.image.bytes[..])).collect();
        assert_eq!(got, [(1, &b"abcd"[..]), (2, b"efgh"), (2, b"efgh"), (2, b"abcd")]);
        assert_eq!(m.content_parts_json(false), json!([{"type": "text", "text": "a"}, {"type": "image"},
            {"type": "text", "text": "b"}, {"type": "image"}, {"type": "image"}, {"type": "image"}]));
        // Serialized with its images inline, it reads back the same.
        let back: ChatMessage = serde_json::from_value(serde_json::to_value(m).unwrap()).unwrap();
        assert_eq!(&back, m);

        let bad = |part: serde_json::Value, access: MediaAccess| {
            let json = json!([{"role": "user", "content": [part]}]);
            parse_messages_json_with(&json.to_string(), access).unwrap_err().to_string()
        };
        let path = json!({"type": "image_url", "image_url": {"url": file.display().to_string()}});
        assert!(bad(path, MediaAccess::InlineOnly).contains("as data: URLs"));
        let remote = json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}});
        assert!(bad(remote, MediaAccess::LocalFiles).contains("remote image URLs are not fetched"));
        let missing = json!({"type": "image", "image": "/no/such/file.png"});
        assert!(bad(missing, MediaAccess::LocalFiles).contains("/no/such/file.png"));
        let garbled = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}});
        assert!(bad(garbled, MediaAccess::LocalFiles).contains("content part 0: inline image is not valid base64"));
        let plain = json!({"type": "image_url", "image_url": {"url": "data:image/png,abc"}});
        assert!(bad(plain, MediaAccess::LocalFiles).contains("must be base64"));
        let empty = json!({"type": "image_url"});
        assert!(bad(empty, MediaAccess::LocalFiles).contains("needs \"image_url\""));
        // Audio parts are kept as audio (decoded by the model's side); a format it cannot take is refused.
        let audio = json!([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}]}]);
        let m = &parse_messages_json_with(&audio.to_string(), MediaAccess::InlineOnly).unwrap()[0];
        assert!(m.images.len() == 1 && m.images[0].audio && &m.images[0].image.bytes[..] == b"RIFF");
        assert_eq!(m.content_parts_json(false), json!([{"type": "audio"}]));
        let back: ChatMessage = serde_json::from_value(serde_json::to_value(m).unwrap()).unwrap();
        assert_eq!(&back, m);
        let ogg = json!({"type": "input_audio", "input_audio": {"data": "", "format": "ogg"}});
        assert!(bad(ogg, MediaAccess::LocalFiles).contains("content part 0 (audio): input_audio format \"ogg\" is not taken"));
    }

    #[test]
    fn unknown_role_named() {
        let err = parse_messages_json(r#"[{"role":"wizard","content":"x"}]"#).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)));
        assert!(err.to_string().contains("\"wizard\""), "{err}");
        let err = serde_json::from_str::<ChatMessage>(r#"{"role":"robot"}"#).unwrap_err();
        assert!(err.to_string().contains("\"robot\""), "{err}");
    }

    #[test]
    fn tool_calls_openai_shape() {
        let msgs = parse_messages_json(
            r#"[{"role":"assistant","content":null,"reasoning_content":"hmm","tool_calls":[
                 {"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}},
                 {"id":"c2","type":"function","function":{"name":"g","arguments":{"y":[2]}}}]},
                {"role":"tool","tool_call_id":"c1","content":"42"}]"#,
        )
        .unwrap();
        assert_eq!(msgs[0].reasoning.as_deref(), Some("hmm"));
        assert_eq!(msgs[0].tool_calls[0], ToolCall::new("c1", "f", json!({"x": 1})));
        assert_eq!(msgs[0].tool_calls[1], ToolCall::new("c2", "g", json!({"y": [2]})));
        assert_eq!(msgs[1], ChatMessage::tool("c1", "42"));
    }

    #[test]
    fn serialize_round_trip() {
        let msgs = vec![
            ChatMessage::system("s"),
            ChatMessage::assistant_with_reasoning("a", "r"),
            ChatMessage::assistant_with_tool_calls("", vec![ToolCall::new("c", "f", json!({"b": 1, "a": 2}))]),
            ChatMessage::tool("c", "ok"),
        ];
        let text = serde_json::to_string(&msgs).unwrap();
        assert!(text.contains(r#""arguments":"{\"b\":1,\"a\":2}""#), "{text}");
        assert!(!text.contains("null"), "{text}");
        assert_eq!(parse_messages_json(&text).unwrap(), msgs);
    }

    #[test]
    fn tools_parse() {
        let tools = parse_tools_json(
            r#"{"tools":[{"type":"function","function":{"name":"get_weather","description":"d",
                "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
                {"name":"bare"}]}"#,
        )
        .unwrap();
        assert_eq!(tools[0].function.name, "get_weather");
        assert_eq!(tools[1].function.parameters, Value::Null);
        let text = serde_json::to_string(&tools[1]).unwrap();
        assert_eq!(text, r#"{"type":"function","function":{"name":"bare"}}"#);
        assert!(parse_tools_json(r#"[{"type":"retrieval"}]"#).is_err());
    }
}
