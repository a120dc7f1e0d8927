//! Loads a `tokenizer.json` whose model is BPE (Llama 3, Qwen, SmolLM, Gemma, …) in about half
//! the time of `tokenizers::Tokenizer::from_file`, which holds the model section three times
//! before building it: serde's untagged helper buffers it, a `#[serde(flatten)]` turns it into a
//! `serde_json::Value`, and the merges are buffered again by another untagged enum. Here the file
//! is parsed once with the model left as raw text, the vocabulary and merges are read from that
//! text straight into what `BpeBuilder` takes, and the tokenizer is assembled as the crate's own
//! deserializer does (pipeline pieces, then the added tokens against the model). SmolLM2's
//! 3.5 MB file: ~74 → ~35 ms on the 2-core CI machine, on the path to the first token.
//!
//! Anything else (WordPiece, Unigram, a model without `type`, a key this reader does not know in
//! the file's top level) returns `None` and the caller takes the crate's path, so the two cannot
//! disagree on what they accept. `tests/tokenizer_real.rs` checks both give the same tokenizer.
use std::fmt;

use ahash::AHashMap;
use serde::de::{Deserializer, Error as _, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokenizers::models::bpe::{BpeBuilder, BPE};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PaddingParams, PostProcessorWrapper,
    PreTokenizerWrapper, TokenizerBuilder, TruncationParams,
};

/// The file's top level: the model read as BPE, the other sections left as raw text until it is
/// known to be a file read here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File<'a> {
    #[serde(borrow)]
    version: Option<&'a RawValue>,
    #[serde(borrow)]
    truncation: Option<&'a RawValue>,
    #[serde(borrow)]
    padding: Option<&'a RawValue>,
    #[serde(borrow)]
    added_tokens: Option<&'a RawValue>,
    #[serde(borrow)]
    normalizer: Option<&'a RawValue>,
    #[serde(borrow)]
    pre_tokenizer: Option<&'a RawValue>,
    #[serde(borrow)]
    post_processor: Option<&'a RawValue>,
    #[serde(borrow)]
    decoder: Option<&'a RawValue>,
    model: BpeSection,
}

/// The BPE model section (the keys `tokenizers`' BPE visitor reads; others are ignored, as there).
#[derive(Deserialize, Default)]
struct BpeSection {
    #[serde(rename = "type")]
    kind: Option<String>,
    vocab: Option<Vocab>,
    merges: Option<Vec<Merge>>,
    dropout: Option<f32>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    fuse_unk: Option<bool>,
    byte_fallback: Option<bool>,
    ignore_merges: Option<bool>,
}

/// `{"token": id, …}` read straight into the map `BpeBuilder` keeps.
struct Vocab(AHashMap<String, u32>);

impl<'de> Deserialize<'de> for Vocab {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vocab;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map of tokens to ids")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Vocab, A::Error> {
                let mut out = AHashMap::with_capacity(m.size_hint().unwrap_or(1 << 15));
                while let Some((token, id)) = m.next_entry::<String, u32>()? {
                    out.insert(token, id);
                }
                Ok(Vocab(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// One merge: `["a", "b"]`, or the older `"a b"` (`None` for a `#version` line, skipped as the
/// crate skips it).
struct Merge(Option<(String, String)>);

impl<'de> Deserialize<'de> for Merge {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Merge;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a merge: a pair of strings or \"a b\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Merge, E> {
                if s.starts_with("#version") {
                    return Ok(Merge(None));
                }
                let mut parts = s.split(' ');
                match (parts.next(), parts.next(), parts.next()) {
                    (Some(a), Some(b), None) => Ok(Merge(Some((a.to_owned(), b.to_owned())))),
                    _ => Err(E::custom(format!("merge {s:?} is not two tokens separated by one space"))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<Merge, A::Error> {
                let a: String = s.next_element()?.ok_or_else(|| A::Error::custom("a merge pair has no first token"))?;
                let b: String = s.next_element()?.ok_or_else(|| A::Error::custom("a merge pair has no second token"))?;
                if s.next_element::<IgnoredAny>()?.is_some() {
                    return Err(A::Error::custom("a merge pair has more than two tokens"));
                }
                Ok(Merge(Some((a, b))))
            }
        }
        d.deserialize_any(V)
    }
}

/// `None`: not a file this reader takes (the caller uses `tokenizers`' own loader).
/// `Some(Err)`: a BPE tokenizer.json this reader takes, with an error (the message names the section).
pub(super) fn load(text: &str) -> Option<Result<tokenizers::Tokenizer, String>> {
    // One pass over the text. A model that is not BPE fails to parse here (its vocab is not a
    // map of ids, or its merges are missing) or says so in `type`: either way the crate decides.
    let mut file: File = serde_json::from_str(text).ok()?;
    if file.model.kind.as_deref() != Some("BPE") {
        return None;
    }
    let model = std::mem::replace(&mut file.model, BpeSection::default());
    Some(assemble(file, model))
}

fn section<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>, name: &str) -> Result<Option<T>, String> {
    match raw {
        None => Ok(None),
        Some(r) => serde_json::from_str::<Option<T>>(r.get()).map_err(|e| format!("{name}: {e}")),
    }
}

fn assemble(file: File, model: BpeSection) -> Result<tokenizers::Tokenizer, String> {
    if let Some(v) = section::<String>(file.version, "version")? {
        if v != "1.0" {
            return Err(format!("unknown tokenizer version '{v}'"));
        }
    }
    let (Some(vocab), Some(merges)) = (model.vocab, model.merges) else {
        return Err("model: missing vocab/merges".into());
    };
    let merges: Vec<(String, String)> = merges.into_iter().filter_map(|m| m.0).collect();
    // The model's options, each set where the file gives one (as the crate's BPE visitor does).
    fn set<T>(b: BpeBuilder, v: Option<T>, f: fn(BpeBuilder, T) -> BpeBuilder) -> BpeBuilder {
        match v {
            Some(v) => f(b, v),
            None => b,
        }
    }
    let mut bpe = BPE::builder().vocab_and_merges(vocab.0, merges);
    bpe = set(bpe, model.dropout, BpeBuilder::dropout);
    bpe = set(bpe, model.unk_token, BpeBuilder::unk_token);
    bpe = set(bpe, model.continuing_subword_prefix, BpeBuilder::continuing_subword_prefix);
    bpe = set(bpe, model.end_of_word_suffix, BpeBuilder::end_of_word_suffix);
    bpe = set(bpe, model.fuse_unk, BpeBuilder::fuse_unk);
    bpe = set(bpe, model.byte_fallback, BpeBuilder::byte_fallback);
    bpe = set(bpe, model.ignore_merges, BpeBuilder::ignore_merges);
    let bpe = bpe.build().map_err(|e| format!("model: {e}"))?;

    let tokenizer = TokenizerBuilder::<
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(ModelWrapper::BPE(bpe))
    .with_normalizer(section(file.normalizer, "normalizer")?)
    .with_pre_tokenizer(section(file.pre_tokenizer, "pre_tokenizer")?)
    .with_post_processor(section(file.post_processor, "post_processor")?)
    .with_decoder(section(file.decoder, "decoder")?)
    .with_truncation(section::<TruncationParams>(file.truncation, "truncation")?)
    .with_padding(section::<PaddingParams>(file.padding, "padding")?)
    .build()
    .map_err(|e| e.to_string())?;
    let mut tokenizer = tokenizers::Tokenizer::from(tokenizer);
    // As the crate's deserializer: the added tokens go in after the model, each keeping the id
    // the model gives its content, or the next free one.
    let added: Vec<AddedToken> = section(file.added_tokens, "added_tokens")?.unwrap_or_default();
    tokenizer.add_tokens(&added);
    Ok(tokenizer)
}

#[cfg(test)]
mod tests {
    use super::load;

    const BPE_JSON: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [
        {"id": 6, "content": "<eos>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        {"id": 0, "content": "a", "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": false}
      ],
      "normalizer": null,
      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
      "post_processor": null,
      "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
      "model": {"type": "BPE", "dropout": null, "unk_token": null, "fuse_unk": false, "byte_fallback": false,
                "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "Ġ": 5}, MERGES}
    }"#;

    fn both(json: &str) -> (tokenizers::Tokenizer, tokenizers::Tokenizer) {
        let fast = load(json).expect("a BPE file is read here").expect("loads");
        let slow: tokenizers::Tokenizer = json.parse().expect("the crate loads it");
        (fast, slow)
    }

    #[test]
    fn reads_both_merge_forms_as_the_crate_does() {
        for merges in [r#""merges": [["a", "b"], ["ab", "c"]]"#, r##""merges": ["#version: 0.2", "a b", "ab c"]"##] {
            let (fast, slow) = both(&BPE_JSON.replace("MERGES", merges));
            assert_eq!(fast.to_string(false).unwrap(), slow.to_string(false).unwrap());
            for text in ["abc", "ab c<eos>abca", "cab"] {
                let f = fast.encode(text, true).unwrap();
                let s = slow.encode(text, true).unwrap();
                assert_eq!(f.get_ids(), s.get_ids(), "{text}");
                assert_eq!(f.get_offsets(), s.get_offsets(), "{text}");
            }
            assert_eq!(fast.token_to_id("<eos>"), Some(6));
        }
    }

    #[test]
    fn leaves_other_files_to_the_crate_and_names_bad_sections() {
        let merges = r#""merges": [["a", "b"]]"#;
        let wordpiece = BPE_JSON.replace(r#""type": "BPE""#, r#""type": "WordPiece""#).replace("MERGES", merges);
        assert!(load(&wordpiece).is_none());
        let unknown_key = BPE_JSON.replace(r#""version": "1.0""#, r#""version": "1.0", "extra": 1"#).replace("MERGES", merges);
        assert!(load(&unknown_key).is_none());
        let bad_merge = BPE_JSON.replace("MERGES", r#""merges": ["a b c"]"#);
        let err = load(&bad_merge).is_none() || load(&bad_merge).unwrap().is_err();
        assert!(err, "a merge of three tokens is refused");
        let bad_decoder = BPE_JSON.replace(r#""decoder": {"type": "ByteLevel""#, r#""decoder": {"type": "NoSuchDecoder""#).replace("MERGES", merges);
        let e = load(&bad_decoder).expect("BPE").expect_err("unknown decoder");
        assert!(e.starts_with("decoder:"), "{e}");
        let missing = BPE_JSON.replace("MERGES", r#""merge": []"#);
        assert!(load(&missing).expect("BPE").is_err());
    }
}
