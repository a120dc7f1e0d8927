//! A checkpoint's tokenizer: Hugging Face `tokenizer.json` through the `tokenizers` crate, the
//! chat template, special tokens and EOS ids, and a streaming detokenizer.
mod detokenizer;
mod fast_load;
mod pyjson;
mod pyrepr;
mod special;
mod template;
mod template_budget;
mod template_consts;
mod template_depth;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

pub use detokenizer::StreamDecoder;
pub use special::SpecialTokens;
pub use template::{ChatTemplate, TemplateOptions, TemplateSource};

use crate::chat::{ChatMessage, ReasoningFormat, Tool, ToolCallFormat};
use crate::error::{Error, Result};
use special::{eos_ids_from_config, push_unique, read_json_optional};

/// Cheap to clone (shared), `Send + Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: tokenizers::Tokenizer,
    special: SpecialTokens,
    eos_ids: Vec<u32>,
    template: Option<ChatTemplate>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("special", &self.inner.special)
            .field("eos_ids", &self.inner.eos_ids)
            .field("has_chat_template", &self.has_chat_template())
            .finish()
    }
}

/// `tokenizer.json`: a BPE model through `fast_load`, anything else through the crate's loader
/// (what `Tokenizer::from_dir` loads it with; public for the test comparing it with the crate's).
#[doc(hidden)]
pub fn load_tokenizer_json(path: &Path) -> Result<tokenizers::Tokenizer> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::checkpoint(path, format!("cannot read: {e}")))?;
    let loaded = match fast_load::load(&text) {
        Some(done) => done,
        None => text.parse::<tokenizers::Tokenizer>().map_err(|e| e.to_string()),
    };
    loaded.map_err(|e| Error::checkpoint(path, format!("cannot load tokenizer: {e}")))
}

/// The crate's own loader (tests compare `fast_load` with it).
#[doc(hidden)]
pub fn load_tokenizer_json_slow(path: &Path) -> Result<tokenizers::Tokenizer> {
    tokenizers::Tokenizer::from_file(path).map_err(|e| Error::checkpoint(path, format!("cannot load tokenizer: {e}")))
}

impl Tokenizer {
    /// Loads `tokenizer.json` (required), and when present `tokenizer_config.json` (special
    /// tokens, chat template), `chat_template.jinja` (overrides the config's template, as in
    /// transformers 5), `chat_template.json`, `generation_config.json` and `config.json` (EOS ids).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(Error::checkpoint(&tokenizer_path, "file not found (the model needs a tokenizer.json)"));
        }
        let tokenizer = load_tokenizer_json(&tokenizer_path)?;

        let tc_path = dir.join("tokenizer_config.json");
        let tc = read_json_optional(&tc_path)?.unwrap_or(Value::Null);
        let special = SpecialTokens::from_config(&tc, &tc_path)?;
        let template = load_template(dir, &tc, &tc_path)?.map(ChatTemplate::new);

        let mut eos_ids = Vec::new();
        for name in ["config.json", "generation_config.json"] {
            let path = dir.join(name);
            if let Some(cfg) = read_json_optional(&path)? {
                push_unique(&mut eos_ids, eos_ids_from_config(&cfg, &path)?);
            }
        }
        if let Some(eos) = &special.eos {
            push_unique(&mut eos_ids, tokenizer.token_to_id(eos));
        }
        Ok(Self::from_parts(tokenizer, special, eos_ids, template))
    }

    /// Builds a tokenizer from pieces already in memory (e.g. a GGUF's embedded vocabulary).
    pub fn from_parts(
        tokenizer: tokenizers::Tokenizer,
        special: SpecialTokens,
        eos_ids: Vec<u32>,
        template: Option<ChatTemplate>,
    ) -> Self {
        Tokenizer { inner: Arc::new(Inner { tokenizer, special, eos_ids, template }) }
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .tokenizer
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encode failed: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("decode failed: {e}")))
    }

    /// Number of ids, added tokens included (transformers' `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.tokenizer.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.tokenizer.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.tokenizer.id_to_token(id)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.inner.special.bos.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.inner.special.eos.as_deref()
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.inner.special
    }

    /// Every id that ends generation: config.json and generation_config.json `eos_token_id`
    /// (int or list) and tokenizer_config.json's `eos_token`, deduplicated, in that order.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.inner.eos_ids.contains(&id)
    }

    pub fn has_chat_template(&self) -> bool {
        self.inner.template.is_some()
    }

    /// The chat template, when the model has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }

    /// The reasoning markers this model uses: from its chat template, else from its vocabulary
    /// (a tokenizer with `<think>` and `</think>` tokens).
    pub fn reasoning_format(&self) -> Option<ReasoningFormat> {
        if let Some(t) = &self.inner.template {
            if let Some(f) = t.sources().find_map(ReasoningFormat::detect) {
                return Some(f);
            }
        }
        ReasoningFormat::ALL
            .into_iter()
            .find(|f| self.token_to_id(f.open()).is_some() && self.token_to_id(f.close()).is_some())
    }

    /// The tool-call format the chat template teaches (Hermes when it says nothing recognisable).
    pub fn tool_call_format(&self) -> ToolCallFormat {
        self.inner.template.as_ref().and_then(|t| t.source(true)).map_or(ToolCallFormat::Hermes, ToolCallFormat::detect)
    }

    /// Renders a conversation to the prompt text, as transformers'
    /// `apply_chat_template(tokenize=False)` would.
    pub fn apply_chat_template(&self, messages: &[ChatMessage], opts: &TemplateOptions<'_>) -> Result<String> {
        let template = self.inner.template.as_ref().ok_or_else(|| {
            Error::Tokenizer(
                "this model has no chat template (no chat_template in tokenizer_config.json and no \
                 chat_template.jinja); pass a raw prompt instead"
                    .into(),
            )
        })?;
        template.render(messages, opts, &self.inner.special)
    }

    /// Tokenizes a prompt the way mlx-lm does: a rendered chat template already holds its special
    /// tokens (encode without adding any); raw text gets them (BOS) unless it already starts with
    /// the BOS token.
    pub fn encode_prompt(&self, text: &str, from_template: bool) -> Result<Vec<u32>> {
        let add_special = !from_template
            && match self.bos_token() {
                Some(bos) => !text.starts_with(bos),
                None => true,
            };
        self.encode(text, add_special)
    }

    /// Token ids of a chat transcript, as the model will see it: rendered through the chat template
    /// (with the generation prompt), or, for a model without one (base models), the messages'
    /// contents joined by newlines as raw text.
    pub fn encode_chat(&self, messages: &[ChatMessage], tools: Option<&[Tool]>, enable_thinking: Option<bool>) -> Result<Vec<u32>> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument("messages is empty".into()));
        }
        if self.has_chat_template() {
            let opts = TemplateOptions { add_generation_prompt: true, tools, enable_thinking, extra: Default::default() };
            let text = self.apply_chat_template(messages, &opts)?;
            self.encode_prompt(&text, true)
        } else {
            let text: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
            self.encode_prompt(&text.join("\n"), false)
        }
    }

    /// [`Tokenizer::encode_chat`] for messages that may hold images: the template's image
    /// markers become what the model's processor writes for each image (`prompt`), one marker
    /// per image. Without images this is `encode_chat`.
    pub fn encode_chat_with_images(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        enable_thinking: Option<bool>,
        prompt: Option<&crate::models::vision_lm::ImagePrompt>,
    ) -> Result<Vec<u32>> {
        self.encode_chat_with_media(messages, tools, enable_thinking, prompt, None)
    }

    /// [`Tokenizer::encode_chat_with_images`] for messages that may hold audio clips too: the
    /// template's audio markers become what stands for each clip (`audio`), one marker per clip.
    pub fn encode_chat_with_media(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Tool]>,
        enable_thinking: Option<bool>,
        prompt: Option<&crate::models::vision_lm::ImagePrompt>,
        audio: Option<&crate::models::audio_input::AudioPrompt>,
    ) -> Result<Vec<u32>> {
        let images = messages.iter().flat_map(|m| &m.images).filter(|i| i.video.is_none() && !i.audio).count();
        let clips = messages.iter().flat_map(|m| &m.images).filter(|i| i.audio).count();
        let videos: Vec<&[crate::chat::media::ImageData]> =
            messages.iter().flat_map(|m| &m.images).filter_map(|i| i.video.as_deref()).collect();
        if images == 0 && videos.is_empty() && clips == 0 {
            return self.encode_chat(messages, tools, enable_thinking);
        }
        let audio = match (audio, clips) {
            (_, 0) => None,
            (Some(a), _) => Some(a),
            (None, _) => return Err(Error::InvalidArgument("this model takes no audio (it has no audio tower)".into())),
        };
        let prompt = match prompt {
            Some(p) => Some(p),
            None if images == 0 && videos.is_empty() => None,
            None => return Err(Error::InvalidArgument("this model takes no images (it has no vision tower)".into())),
        };
        let video = match (prompt.and_then(|p| p.video.as_ref()), videos.is_empty()) {
            (_, true) => None,
            (Some(v), false) => Some(v),
            (None, false) => return Err(Error::InvalidArgument("this model takes no video".into())),
        };
        if !self.has_chat_template() {
            return Err(Error::InvalidArgument("images and audio need the model's chat template, and it has none".into()));
        }
        let opts = TemplateOptions { add_generation_prompt: true, tools, enable_thinking, extra: Default::default() };
        let mut text = self.apply_chat_template(messages, &opts)?;
        if let Some(a) = audio {
            let markers = text.matches(a.marker.as_str()).count();
            if markers != clips {
                return Err(Error::InvalidArgument(format!(
                    "the chat template placed {markers} audio marker(s) ({}) for {clips} audio clip(s)",
                    a.marker
                )));
            }
            text = text.replace(a.marker.as_str(), &a.expansion);
        }
        if let Some(prompt) = prompt {
            let markers = text.matches(prompt.marker.as_str()).count();
            if markers != images {
                return Err(Error::InvalidArgument(format!(
                    "the chat template placed {markers} image marker(s) ({}) for {images} image(s)",
                    prompt.marker
                )));
            }
            // Per image where the expansion depends on it (Gemma 3's pan and scan).
            let bytes: Vec<&[u8]> = messages
                .iter()
                .flat_map(|m| &m.images)
                .filter(|i| i.video.is_none() && !i.audio)
                .map(|i| &i.image.bytes[..])
                .collect();
            text = prompt.expand_markers(&text, &bytes)?;
        }
        if let Some(v) = video {
            // After the images' expansion (which holds no video marker); each video's own.
            let pieces: Vec<&str> = text.split(v.marker.as_str()).collect();
            if pieces.len() - 1 != videos.len() {
                return Err(Error::InvalidArgument(format!(
                    "the chat template placed {} video marker(s) ({}) for {} video(s)",
                    pieces.len() - 1,
                    v.marker,
                    videos.len()
                )));
            }
            let mut joined = String::with_capacity(text.len());
            for (k, piece) in pieces.iter().enumerate() {
                joined.push_str(piece);
                if let Some(frames) = videos.get(k) {
                    joined.push_str(&v.expansion(frames));
                }
            }
            text = joined;
        }
        self.encode_prompt(&text, true)
    }

    /// A streaming detokenizer that keeps special tokens' text (e.g. `<think>`, `<|im_end|>`).
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new(self.clone(), false)
    }

    pub fn stream_decoder_with(&self, skip_special_tokens: bool) -> StreamDecoder {
        StreamDecoder::new(self.clone(), skip_special_tokens)
    }

    /// The underlying `tokenizers` object, for what this wrapper does not cover.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner.tokenizer
    }
}

/// The template transformers 5 would use: `chat_template.jinja` first, then the legacy
/// `chat_template.json`, then tokenizer_config.json's `chat_template` (a string or a list of
/// `{name, template}`).
fn load_template(dir: &Path, tc: &Value, tc_path: &Path) -> Result<Option<TemplateSource>> {
    let jinja = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&jinja) {
        Ok(s) => return Ok(Some(TemplateSource::Single(s))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("reading {}", jinja.display()), e)),
    }
    let json_path = dir.join("chat_template.json");
    if let Some(v) = read_json_optional(&json_path)? {
        if let Some(src) = template_field(v.get("chat_template"), &json_path)? {
            return Ok(Some(src));
        }
    }
    template_field(tc.get("chat_template"), tc_path)
}

fn template_field(v: Option<&Value>, file: &Path) -> Result<Option<TemplateSource>> {
    let bad = || Error::checkpoint(file, "chat_template must be a string or a list of {name, template}");
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(TemplateSource::Single(s.clone()))),
        Some(Value::Array(list)) => {
            let named = list
                .iter()
                .map(|item| {
                    let name = item.get("name").and_then(Value::as_str).ok_or_else(bad)?;
                    let tmpl = item.get("template").and_then(Value::as_str).ok_or_else(bad)?;
                    Ok((name.to_string(), tmpl.to_string()))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(TemplateSource::Named(named)))
        }
        Some(_) => Err(bad()),
    }
}

#[cfg(test)]
mod tests;
