//! Unit tests on tiny hand-written tokenizers (real ones: tests/tokenizer_real.rs).
use std::path::Path;

use serde_json::{json, Value};

use super::*;
use crate::chat::ChatMessage;

/// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest map to 256+n.
fn byte_level_alphabet() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap()
            }
        })
        .collect()
}

fn added(id: u32, content: &str) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": true})
}

/// A byte-level BPE with no merges: every byte is one token (ids 0..256), so any multi-byte
/// character is split across tokens. Added: 256 `<s>`, 257 `</s>`, 258 `<|im_end|>`.
fn byte_level_json() -> Value {
    let vocab: serde_json::Map<String, Value> =
        byte_level_alphabet().iter().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(256, "<s>"), added(257, "</s>"), added(258, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

/// A Llama-2-style SentencePiece setup (Metaspace "▁", byte fallback, strip of the first space)
/// over a WordLevel vocabulary; adds `<s>` in front when asked for special tokens.
fn sentencepiece_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for (i, w) in ["<unk>", "<s>", "</s>", "▁hello", "▁world", "▁", "!"].iter().enumerate() {
        vocab.insert(w.to_string(), json!(i));
    }
    for b in 0..256u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(7 + b));
    }
    let bos = json!({"SpecialToken": {"id": "<s>", "type_id": 0}});
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
        "post_processor": {"type": "TemplateProcessing",
            "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    })
}

fn write(dir: &Path, name: &str, v: &Value) {
    std::fs::write(dir.join(name), serde_json::to_string_pretty(v).unwrap()).unwrap();
}

fn model_dir(tokenizer: Value, config: Option<Value>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tokenizer.json", &tokenizer);
    if let Some(c) = config {
        write(dir.path(), "tokenizer_config.json", &c);
    }
    dir
}

/// Checks the streaming contract: chunks join to the full decode, none splits a character.
fn assert_streams(tok: &Tokenizer, ids: &[u32], skip: bool) -> Vec<String> {
    let mut dec = tok.stream_decoder_with(skip);
    let mut chunks: Vec<String> = ids.iter().map(|&id| dec.push(id).unwrap()).collect();
    chunks.push(dec.finish().unwrap());
    for c in &chunks {
        assert!(!c.contains('\u{FFFD}'), "chunk with a split character: {c:?} in {chunks:?}");
    }
    assert_eq!(chunks.concat(), tok.decode(ids, skip).unwrap(), "chunks {chunks:?}");
    chunks
}

#[test]
fn missing_tokenizer_json_names_path() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    let path = dir.path().join("tokenizer.json");
    assert!(matches!(&err, Error::InvalidCheckpoint { file, .. } if *file == path), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}

#[test]
fn unreadable_tokenizer_json_names_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn malformed_tokenizer_config_names_file() {
    let dir = model_dir(byte_level_json(), None);
    std::fs::write(dir.path().join("tokenizer_config.json"), "{\"bos_token\": ").unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err();
    assert!(matches!(&err, Error::InvalidCheckpoint { file, .. } if file.ends_with("tokenizer_config.json")), "{err}");
    assert!(err.to_string().contains("malformed JSON"), "{err}");
}

#[test]
fn eos_ids_from_all_three_sources() {
    let dir = model_dir(byte_level_json(), Some(json!({"eos_token": "<|im_end|>", "bos_token": "<s>"})));
    write(dir.path(), "config.json", &json!({"eos_token_id": 257}));
    write(dir.path(), "generation_config.json", &json!({"eos_token_id": [257, 10]}));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.eos_token_ids(), [257, 10, 258]);
    assert!(tok.is_eos(258) && !tok.is_eos(0));
    assert_eq!(tok.bos_token(), Some("<s>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
}

#[test]
fn no_chat_template_is_a_clear_error() {
    let dir = model_dir(byte_level_json(), Some(json!({})));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert!(!tok.has_chat_template());
    let err = tok.apply_chat_template(&[ChatMessage::user("hi")], &TemplateOptions::default()).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
}

#[test]
fn jinja_file_overrides_config_template() {
    let dir = model_dir(byte_level_json(), Some(json!({"chat_template": "config", "bos_token": {"content": "<s>"}})));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let msgs = [ChatMessage::user("hi")];
    assert_eq!(tok.apply_chat_template(&msgs, &TemplateOptions::default()).unwrap(), "config");
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ bos_token }}{{ messages[0].content }}\n").unwrap();
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    // Jinja drops one trailing newline of the template source, and so must we.
    assert_eq!(tok.apply_chat_template(&msgs, &TemplateOptions::default()).unwrap(), "<s>hi");
}

#[test]
fn template_errors_surface() {
    let tmpl = "{% if messages|length > 1 %}{{ raise_exception('Only one message!') }}{% endif %}ok";
    let dir = model_dir(byte_level_json(), Some(json!({"chat_template": tmpl})));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let opts = TemplateOptions::default();
    assert_eq!(tok.apply_chat_template(&[ChatMessage::user("a")], &opts).unwrap(), "ok");
    let err = tok.apply_chat_template(&[ChatMessage::user("a"), ChatMessage::user("b")], &opts).unwrap_err();
    assert!(matches!(err, Error::Tokenizer(ref m) if m.contains("Only one message!")), "{err}");
    let err = tok.apply_chat_template(&[], &opts).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[test]
fn byte_level_round_trip_and_stream() {
    let dir = model_dir(byte_level_json(), None);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.vocab_size(), 259);
    let text = "héllo 😀 世界!";
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(ids.len(), text.len(), "one token per byte");
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let chunks = assert_streams(&tok, &ids, false);
    // The 4 bytes of the emoji come out as one chunk, on its last byte.
    assert!(chunks.contains(&"😀".to_string()), "{chunks:?}");
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(258));
    assert_eq!(tok.id_to_token(258).as_deref(), Some("<|im_end|>"));
}

#[test]
fn stream_special_tokens_kept_or_skipped() {
    let dir = model_dir(byte_level_json(), None);
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    let mut ids = vec![256];
    ids.extend(tok.encode("a é", false).unwrap());
    ids.push(258);
    let kept = assert_streams(&tok, &ids, false).concat();
    assert_eq!(kept, "<s>a é<|im_end|>");
    assert_eq!(assert_streams(&tok, &ids, true).concat(), "a é");
}

#[test]
fn sentencepiece_spaces_and_byte_fallback_stream() {
    let dir = model_dir(sentencepiece_json(), Some(json!({"bos_token": "<s>"})));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.encode("hello world", true).unwrap(), [1, 3, 4]);
    assert_eq!(tok.encode("hello world", false).unwrap(), [3, 4]);
    let euro = [7 + 0xE2, 7 + 0x82, 7 + 0xAC];
    let mut ids = vec![1, 3, 4];
    ids.extend(euro);
    ids.extend([3, 6]);
    let chunks = assert_streams(&tok, &ids, true);
    assert_eq!(chunks.concat(), "hello world€ hello!");
    assert_eq!(chunks[1..=5], ["hello", " world", "", "", "€"]);
    assert_streams(&tok, &ids, false);
    // Generation that starts mid-sentence keeps the space of its first token, as decode does.
    assert_streams(&tok, &[4, 3], true);
    // A dangling partial character is flushed by finish, rendered like decode renders it.
    let mut dec = tok.stream_decoder_with(true);
    assert_eq!(dec.push(7 + 0xE2).unwrap(), "");
    assert_eq!(dec.finish().unwrap(), tok.decode(&[7 + 0xE2], true).unwrap());
}

#[test]
fn encode_prompt_adds_bos_once() {
    let dir = model_dir(sentencepiece_json(), Some(json!({"bos_token": "<s>"})));
    let tok = Tokenizer::from_dir(dir.path()).unwrap();
    assert_eq!(tok.encode_prompt("hello", false).unwrap(), [1, 3]);
    assert_eq!(tok.encode_prompt("<s>hello", false).unwrap(), [1, 3]);
    assert_eq!(tok.encode_prompt("<s> hello", true).unwrap(), [1, 3]);
    assert_eq!(tok.encode_prompt("hello", true).unwrap(), [3]);
}

#[test]
fn tokenizer_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<StreamDecoder>();
}
