//! tokenizer.json / tokenizer_config.json from a GGUF vocabulary.
//!
//! - `tokenizer.ggml.model == "gpt2"`: byte-level BPE with the file's merges; the split regex comes
//!   from `tokenizer.ggml.pre` (the same pre-tokenizers HF ships for those model families).
//! - `tokenizer.ggml.model == "llama"`: SentencePiece BPE as HF's fast Llama tokenizer expresses it
//!   (▁ for spaces, byte fallback `<0xNN>` tokens, merges recovered from the piece scores).
use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value as Json};

use crate::error::Result;
use crate::gguf::GgufFile;

pub const TOKEN_NORMAL: i64 = 1;
pub const TOKEN_UNKNOWN: i64 = 2;
pub const TOKEN_CONTROL: i64 = 3;
pub const TOKEN_USER_DEFINED: i64 = 4;
pub const TOKEN_UNUSED: i64 = 5;
pub const TOKEN_BYTE: i64 = 6;

const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The vocabulary as read from the file.
pub struct Vocab {
    pub model: String,
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub types: Vec<i64>,
    pub scores: Option<Vec<f32>>,
    pub merges: Option<Vec<String>>,
    pub bos: Option<u64>,
    pub eos: Option<u64>,
    pub eot: Option<u64>,
    pub unk: Option<u64>,
    pub pad: Option<u64>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
}

impl Vocab {
    pub fn read(g: &GgufFile) -> Result<Option<Self>> {
        let Some(model) = g.get_str("tokenizer.ggml.model")? else { return Ok(None) };
        let tokens: Vec<String> = g
            .get_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| g.err("missing metadata key 'tokenizer.ggml.tokens'"))?
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| g.err(format!("tokenizer.ggml.tokens[{i}] is not a string")))
            })
            .collect::<Result<_>>()?;
        let n = tokens.len();
        let types = match g.get_array("tokenizer.ggml.token_type")? {
            None => vec![TOKEN_NORMAL; n],
            Some(a) => {
                if a.len() != n {
                    return Err(g.err(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", a.len())));
                }
                a.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_int()
                            .map(|x| x as i64)
                            .ok_or_else(|| g.err(format!("tokenizer.ggml.token_type[{i}] is not an integer")))
                    })
                    .collect::<Result<_>>()?
            }
        };
        let scores = match g.get_array("tokenizer.ggml.scores")? {
            None => None,
            Some(a) => {
                if a.len() != n {
                    return Err(g.err(format!("tokenizer.ggml.scores has {} entries for {n} tokens", a.len())));
                }
                Some(
                    a.iter()
                        .enumerate()
                        .map(|(i, v)| {
                            v.as_f64()
                                .map(|x| x as f32)
                                .ok_or_else(|| g.err(format!("tokenizer.ggml.scores[{i}] is not a number")))
                        })
                        .collect::<Result<_>>()?,
                )
            }
        };
        let merges = match g.get_array("tokenizer.ggml.merges")? {
            None => None,
            Some(a) => Some(
                a.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| g.err(format!("tokenizer.ggml.merges[{i}] is not a string")))
                    })
                    .collect::<Result<_>>()?,
            ),
        };
        let id = |key: &str| -> Result<Option<u64>> {
            match g.get_u64(key)? {
                Some(v) if v as usize >= n => {
                    Err(g.err(format!("metadata key '{key}' = {v} is outside the vocabulary ({n} tokens)")))
                }
                other => Ok(other),
            }
        };
        Ok(Some(Vocab {
            model: model.to_string(),
            pre: g.get_str("tokenizer.ggml.pre")?.map(str::to_string),
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: g.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: g.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: g.get_bool("tokenizer.ggml.add_space_prefix")?,
            chat_template: g.get_str("tokenizer.chat_template")?.map(str::to_string),
            tokens,
            types,
            scores,
            merges,
        }))
    }

    fn token(&self, id: Option<u64>) -> Option<&str> {
        id.map(|i| self.tokens[i as usize].as_str())
    }

    /// Default for add_bos when the file does not say (llama.cpp's defaults per model).
    fn add_bos(&self) -> bool {
        self.add_bos.unwrap_or(self.model == "llama")
    }

    fn added_tokens(&self) -> Vec<Json> {
        let mut out = Vec::new();
        for (i, (t, &ty)) in self.tokens.iter().zip(&self.types).enumerate() {
            let special = ty == TOKEN_CONTROL || (ty == TOKEN_UNKNOWN && self.model == "llama");
            if special || ty == TOKEN_USER_DEFINED {
                out.push(json!({
                    "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": !special, "special": special,
                }));
            }
        }
        out
    }

    /// Vocabulary map token → id (the first id wins for duplicated strings).
    fn vocab_map(&self) -> Map<String, Json> {
        let mut m = Map::with_capacity(self.tokens.len());
        for (i, t) in self.tokens.iter().enumerate() {
            if !m.contains_key(t) {
                m.insert(t.clone(), json!(i));
            }
        }
        m
    }

    fn post_processor(&self, byte_level: bool) -> Json {
        let bos = self.add_bos().then(|| self.token(self.bos)).flatten();
        let eos = self.add_eos.unwrap_or(false).then(|| self.token(self.eos)).flatten();
        if bos.is_none() && eos.is_none() {
            return if byte_level {
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true})
            } else {
                Json::Null
            };
        }
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut specials = Map::new();
        let sp = |t: &str| json!({"SpecialToken": {"id": t, "type_id": 0}});
        if let Some(b) = bos {
            single.push(sp(b));
            pair.push(sp(b));
            specials.insert(b.into(), json!({"id": b, "ids": [self.bos], "tokens": [b]}));
        }
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        if let Some(e) = eos {
            single.push(sp(e));
            pair.push(sp(e));
            specials.insert(e.into(), json!({"id": e, "ids": [self.eos], "tokens": [e]}));
        }
        if let Some(b) = bos {
            pair.push(json!({"SpecialToken": {"id": b, "type_id": 1}}));
        }
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        if let Some(e) = eos {
            pair.push(json!({"SpecialToken": {"id": e, "type_id": 1}}));
        }
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
    }

    /// Build tokenizer.json. Warnings (e.g. an unknown pre-tokenizer) are pushed to `warnings`.
    pub fn tokenizer_json(&self, g: &GgufFile, warnings: &mut Vec<String>) -> Result<Json> {
        match self.model.as_str() {
            "gpt2" => self.bpe_json(g, warnings),
            "llama" => self.spm_json(g),
            other => Err(g.err(format!(
                "unsupported tokenizer model '{other}' (tokenizer.ggml.model); supported: gpt2, llama"
            ))),
        }
    }

    fn bpe_json(&self, g: &GgufFile, warnings: &mut Vec<String>) -> Result<Json> {
        let merges = self
            .merges
            .as_ref()
            .ok_or_else(|| g.err("tokenizer.ggml.model is 'gpt2' but tokenizer.ggml.merges is missing"))?;
        let merges: Vec<Json> = merges
            .iter()
            .enumerate()
            .map(|(i, m)| {
                m.split_once(' ')
                    .map(|(a, b)| json!([a, b]))
                    .ok_or_else(|| g.err(format!("tokenizer.ggml.merges[{i}] = {m:?} is not 'a b'")))
            })
            .collect::<Result<_>>()?;
        let byte_level = |use_regex: bool| {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
        };
        let split = |re: &str| {
            json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false})
        };
        let pre = self.pre.as_deref().unwrap_or("default");
        let mut normalizer = Json::Null;
        let mut ignore_merges = false;
        let pre_tokenizer = match pre {
            // GPT-2's split regex is the ByteLevel pre-tokenizer's own (`use_regex`).
            "default" | "gpt-2" | "gpt2" | "phi-2" | "olmo" | "jais" | "mpt" => byte_level(true),
            "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" | "exaone" | "minerva-7b" => json!({
                "type": "Sequence",
                "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)],
            }),
            "qwen2" | "deepseek-r1-qwen" | "megrez" | "hunyuan" => {
                normalizer = json!({"type": "NFC"});
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false)]})
            }
            "llama-bpe" | "llama3" | "llama-v3" | "smaug-bpe" | "falcon3" | "pixtral" | "dbrx" => {
                ignore_merges = true;
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false)]})
            }
            other => {
                warnings.push(format!(
                    "unknown tokenizer.ggml.pre '{other}': using the GPT-2 pre-tokenizer; check tokenization"
                ));
                byte_level(true)
            }
        };
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": self.added_tokens(),
            "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": self.post_processor(true),
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "ignore_merges": ignore_merges,
                "vocab": self.vocab_map(),
                "merges": merges,
            },
        }))
    }

    /// Merges for a SentencePiece BPE vocabulary, recovered from the scores: every split of a
    /// normal piece into two pieces of the vocabulary is a merge, ranked by the merged piece's
    /// score (higher first), ties by the ids of the parts.
    fn spm_merges(&self) -> Vec<(String, String)> {
        let scores = self.scores.as_deref();
        let mut index: HashMap<&str, usize> = HashMap::with_capacity(self.tokens.len());
        for (i, t) in self.tokens.iter().enumerate() {
            index.entry(t.as_str()).or_insert(i);
        }
        let mergeable: HashSet<usize> = (0..self.tokens.len())
            .filter(|&i| matches!(self.types[i], TOKEN_NORMAL | TOKEN_USER_DEFINED))
            .collect();
        let mut all: Vec<(f32, usize, usize, usize)> = Vec::new();
        for (i, piece) in self.tokens.iter().enumerate() {
            if self.types[i] != TOKEN_NORMAL || piece.chars().count() < 2 {
                continue;
            }
            let score = scores.map(|s| s[i]).unwrap_or(-(i as f32));
            let mut local = Vec::new();
            for (pos, _) in piece.char_indices().skip(1) {
                let (l, r) = piece.split_at(pos);
                if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                    if mergeable.contains(&li) && mergeable.contains(&ri) {
                        local.push((li, ri));
                    }
                }
            }
            local.sort();
            all.extend(local.into_iter().map(|(l, r)| (score, i, l, r)));
        }
        // Stable sort: by score, descending; ties keep the (piece id, part ids) order.
        all.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
        all.into_iter().map(|(_, _, l, r)| (self.tokens[l].clone(), self.tokens[r].clone())).collect()
    }

    fn spm_json(&self, g: &GgufFile) -> Result<Json> {
        if !self.types.contains(&TOKEN_BYTE) {
            return Err(g.err(
                "SentencePiece vocabulary without byte tokens (<0xNN>) is not supported (needs byte fallback)",
            ));
        }
        let merges: Vec<Json> = self.spm_merges().into_iter().map(|(a, b)| json!([a, b])).collect();
        let prefix = self.add_space_prefix.unwrap_or(true);
        let mut norm = Vec::new();
        if prefix {
            norm.push(json!({"type": "Prepend", "prepend": "\u{2581}"}));
        }
        norm.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}));
        let mut dec = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if prefix {
            dec.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        let unk = self.token(self.unk).or_else(|| {
            self.types.iter().position(|&t| t == TOKEN_UNKNOWN).map(|i| self.tokens[i].as_str())
        });
        Ok(json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": self.added_tokens(),
            "normalizer": {"type": "Sequence", "normalizers": norm},
            "pre_tokenizer": null,
            "post_processor": self.post_processor(false),
            "decoder": {"type": "Sequence", "decoders": dec},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": self.vocab_map(),
                "merges": merges,
            },
        }))
    }

    /// tokenizer_config.json.
    pub fn tokenizer_config(&self) -> Json {
        let mut c = Map::new();
        c.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        c.insert("add_bos_token".into(), json!(self.add_bos()));
        c.insert("add_eos_token".into(), json!(self.add_eos.unwrap_or(false)));
        c.insert("bos_token".into(), json!(self.token(self.bos)));
        c.insert("eos_token".into(), json!(self.token(self.eos)));
        c.insert("unk_token".into(), json!(self.token(self.unk)));
        c.insert("pad_token".into(), json!(self.token(self.pad)));
        c.insert("clean_up_tokenization_spaces".into(), json!(false));
        let mut added = Map::new();
        for t in self.added_tokens() {
            let id = t["id"].to_string();
            let mut t = t;
            t.as_object_mut().unwrap().remove("id");
            added.insert(id, t);
        }
        c.insert("added_tokens_decoder".into(), Json::Object(added));
        if let Some(t) = &self.chat_template {
            c.insert("chat_template".into(), json!(t));
        }
        Json::Object(c)
    }

    /// End-of-generation ids: eos, plus eot when it differs.
    pub fn eos_ids(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.eos.into_iter().collect();
        if let Some(e) = self.eot {
            if !v.contains(&e) {
                v.push(e);
            }
        }
        v
    }
}
