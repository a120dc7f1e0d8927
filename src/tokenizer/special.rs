//! Special tokens and end-of-sequence ids, gathered from the config files a checkpoint ships.
//! Checkpoints disagree about where they declare EOS (config.json, generation_config.json,
//! tokenizer_config.json), and chat models often end turns with a token only one of them names,
//! so the engine stops on the union.
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// The named special-token strings of tokenizer_config.json (transformers' special_tokens_map).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub unk: Option<String>,
    pub sep: Option<String>,
    pub pad: Option<String>,
    pub cls: Option<String>,
    pub mask: Option<String>,
}

impl SpecialTokens {
    /// Reads `bos_token`, `eos_token`, … each a string or an AddedToken object `{content: …}`.
    pub fn from_config(config: &Value, file: &Path) -> Result<Self> {
        let get = |key: &str| token_string(config.get(key), file, key);
        Ok(SpecialTokens {
            bos: get("bos_token")?,
            eos: get("eos_token")?,
            unk: get("unk_token")?,
            sep: get("sep_token")?,
            pad: get("pad_token")?,
            cls: get("cls_token")?,
            mask: get("mask_token")?,
        })
    }

    /// `(template variable, token)` for the tokens that are set, in transformers' order.
    pub fn named(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("bos_token", &self.bos),
            ("eos_token", &self.eos),
            ("unk_token", &self.unk),
            ("sep_token", &self.sep),
            ("pad_token", &self.pad),
            ("cls_token", &self.cls),
            ("mask_token", &self.mask),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
    }
}

fn token_string(v: Option<&Value>, file: &Path, key: &str) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(Error::checkpoint(file, format!("{key}: an AddedToken object needs a string \"content\""))),
        },
        Some(_) => Err(Error::checkpoint(file, format!("{key} must be a string or an AddedToken object"))),
    }
}

/// `eos_token_id` of config.json / generation_config.json: an int, a list of ints, or null.
/// Multimodal configs keep it under `text_config`.
pub fn eos_ids_from_config(config: &Value, file: &Path) -> Result<Vec<u32>> {
    let field = config
        .get("eos_token_id")
        .filter(|v| !v.is_null())
        .or_else(|| config.get("text_config").and_then(|t| t.get("eos_token_id")));
    let bad = || Error::checkpoint(file, "eos_token_id must be a token id or a list of token ids");
    let as_id = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad);
    match field {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list.iter().map(as_id).collect(),
        Some(v) => Ok(vec![as_id(v)?]),
    }
}

/// Reads an optional JSON file: `Ok(None)` when absent, an error naming the file when malformed.
pub fn read_json_optional(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::checkpoint(path, format!("malformed JSON: {e}")))
}

/// Appends ids not seen yet, keeping first-seen order.
pub fn push_unique(into: &mut Vec<u32>, ids: impl IntoIterator<Item = u32>) {
    for id in ids {
        if !into.contains(&id) {
            into.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tokens_as_string_or_added_token() {
        let cfg = json!({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "pad_token": null});
        let t = SpecialTokens::from_config(&cfg, Path::new("tokenizer_config.json")).unwrap();
        assert_eq!(t.bos.as_deref(), Some("<s>"));
        assert_eq!(t.eos.as_deref(), Some("</s>"));
        assert_eq!(t.pad, None);
        let names: Vec<_> = t.named().map(|(k, _)| k).collect();
        assert_eq!(names, ["bos_token", "eos_token"]);
        let err = SpecialTokens::from_config(&json!({"eos_token": 5}), Path::new("tc.json")).unwrap_err();
        assert!(err.to_string().contains("tc.json") && err.to_string().contains("eos_token"), "{err}");
    }

    #[test]
    fn eos_id_shapes() {
        let p = Path::new("config.json");
        assert_eq!(eos_ids_from_config(&json!({"eos_token_id": 2}), p).unwrap(), [2]);
        assert_eq!(eos_ids_from_config(&json!({"eos_token_id": [1, 106]}), p).unwrap(), [1, 106]);
        assert!(eos_ids_from_config(&json!({"eos_token_id": null}), p).unwrap().is_empty());
        assert_eq!(eos_ids_from_config(&json!({"text_config": {"eos_token_id": [7]}}), p).unwrap(), [7]);
        assert!(eos_ids_from_config(&json!({"eos_token_id": "x"}), p).is_err());
        let mut v = vec![2];
        push_unique(&mut v, [3, 2, 3, 4]);
        assert_eq!(v, [2, 3, 4]);
    }
}
