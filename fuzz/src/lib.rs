//! mlex's pure parsers (chat output, safetensors headers, GGUF, config.json, chat templates) and
//! image and audio decoding, compiled on their own for fuzzing (see Cargo.toml). The files keep their
//! `super::` and `crate::` paths: the chat files sit at the crate root, which stands in for
//! `mlex::chat`, and the others sit in modules named as in mlex (`loader`, `gguf`, `tokenizer`,
//! `mlx`, `media`).
#![allow(dead_code, unused_imports, unreachable_patterns)]

/// mlex's error type (plain Rust).
#[path = "../../src/error.rs"]
pub mod error;

#[path = "../../src/chat/media.rs"]
pub mod chat_media;
#[path = "../../src/chat/audio_part.rs"]
pub mod audio_part;
#[path = "../../src/chat/messages.rs"]
mod messages;
#[path = "../../src/chat/parse.rs"]
pub mod parse;
#[path = "../../src/chat/reasoning.rs"]
pub mod reasoning;
#[path = "../../src/chat/stream.rs"]
pub mod stream;
#[path = "../../src/chat/tools.rs"]
pub mod tools;

pub use messages::{parse_messages_json, parse_messages_json_with, parse_tools_json, ChatMessage, ContentPart, FunctionDef, Role, Tool, ToolCall};

/// The same names as `mlex::chat`.
pub mod chat {
    pub use super::reasoning::ReasoningFormat;
    pub use super::stream::{self, OutputClassifier, Part, Segment, SpanKind};
    pub use super::parse::{self, parse_tool_calls, parse_tool_calls_with_tools};
    pub use super::tools::ToolCallFormat;
    pub use super::audio_part;
    pub use super::chat_media as media;
    pub use super::chat_media::{ImageData, MediaAccess, MessageImage};
    pub use super::{parse_messages_json, parse_messages_json_with, parse_tools_json, ChatMessage, ContentPart, Role, Tool, ToolCall};
}

// The other files sit at the crate root too, each file's `super::` being its siblings (a
// `#[path]` inside an inline module would resolve through folders that do not exist here); the
// modules named as in mlex re-export them.

/// The one FFI name dtype.rs uses (`mlex_dtype`, an unsigned int in shim.h).
mod sys {
    #[allow(non_camel_case_types)]
    pub type mlex_dtype = std::os::raw::c_uint;
}
#[path = "../../src/mlx/dtype.rs"]
mod dtype;
#[path = "../../src/mlx/quant_mode.rs"]
mod quant_mode;
#[path = "../../src/loader/config.rs"]
#[doc(hidden)]
pub mod config;
#[path = "../../src/loader/quant_config.rs"]
#[doc(hidden)]
pub mod quant_config;
#[path = "../../src/loader/safetensors_header.rs"]
#[doc(hidden)]
pub mod safetensors_header;
#[path = "../../src/tokenizer/pyjson.rs"]
#[doc(hidden)]
pub mod pyjson;
#[path = "../../src/tokenizer/pyrepr.rs"]
#[doc(hidden)]
pub mod pyrepr;
#[path = "../../src/tokenizer/special.rs"]
#[doc(hidden)]
pub mod special;
#[path = "../../src/tokenizer/template_budget.rs"]
#[doc(hidden)]
pub mod template_budget;
#[path = "../../src/tokenizer/template_consts.rs"]
#[doc(hidden)]
pub mod template_consts;
#[path = "../../src/tokenizer/template_depth.rs"]
#[doc(hidden)]
pub mod template_depth;
#[path = "../../src/tokenizer/template.rs"]
#[doc(hidden)]
pub mod template;

/// mlex's image decoding and Gemma 3 preprocessing (the `image` crate, pure Rust); named
/// `media_image` here, `image` being the crate it uses.
#[path = "../../src/media/image.rs"]
#[doc(hidden)]
pub mod media_image;

/// mlex's animated-image decoding (a video part given as one animated GIF, WebP or PNG).
#[path = "../../src/media/animation.rs"]
#[doc(hidden)]
pub mod media_animation;

/// mlex's audio decoding (symphonia: WAV, FLAC, MP3), resampling and Gemma 4's log-mel features.
#[path = "../../src/media/audio.rs"]
#[doc(hidden)]
pub mod media_audio;
#[path = "../../src/media/audio_features.rs"]
#[doc(hidden)]
pub mod media_audio_features;

/// `mlex::gguf`: the reader, its block decoders and the writer (seeds).
#[path = "../../src/gguf/mod.rs"]
pub mod gguf;

/// The plain-Rust parts of `mlex::mlx`: element types and quantization modes.
pub mod mlx {
    pub use super::dtype::Dtype;
    pub use super::quant_mode::QuantMode;
}

/// `mlex::loader`'s parsers: config.json, its quantization block, safetensors headers and the
/// shard index.
pub mod loader {
    pub use super::{config, quant_config, safetensors_header};
}

/// `mlex::media`: image bytes to RGB, and Gemma 3's image processor.
pub mod media {
    pub use super::media_image::{
        decode_image, image_size, resize_bilinear, Gemma3ImageProcessor, PixelValues, RgbImage, MAX_IMAGE_PIXELS,
    };
    pub(crate) use super::media_image::{check_png_palette, to_rgb};
    pub use super::media_animation as animation;
    pub use super::media_audio::{decode_audio, load_audio, resample_poly, Waveform, MAX_AUDIO_BYTES};
    pub use super::media_audio_features::{AudioFeatures, Gemma4AudioFeatureExtractor};
    // (chat/messages.rs, at the crate root here, reads `super::media` as mlex's `chat::media`)
    pub use super::chat_media::*;
}

/// `mlex::serve`'s request parsing.
pub mod serve;

/// `mlex::tokenizer`'s chat templates (minijinja with transformers' extensions).
pub mod tokenizer {
    pub use super::{pyjson, pyrepr, special, template, template_budget, template_consts, template_depth};
}

/// Whether every tool-call part of a classified reply parses into at least one call, decided as
/// `OutputClassifier::into_output` decides it (the stream_classifier target's condition for the
/// reply's text to equal the streamed text; counting calls is not enough, one part may hold
/// several).
pub fn every_call_parses(format: Option<chat::ToolCallFormat>, parts: &[chat::Part]) -> bool {
    let format = format.unwrap_or(chat::ToolCallFormat::Hermes);
    parts.iter().all(|p| match p {
        chat::Part::ToolCall { open, body, close } => {
            (close.is_some() || format.closer_for(open).is_none())
                && tools::parse_call_body(format, open, body, None).is_ok_and(|c| !c.is_empty())
        }
        _ => true,
    })
}
