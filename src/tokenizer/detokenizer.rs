//! Incremental detokenization for streaming. Decoding token by token is wrong for both common
//! tokenizer families: SentencePiece drops the leading "▁" space of whatever token comes first
//! in a decode call, and byte-level BPE / byte-fallback tokens can end in the middle of a UTF-8
//! character. So each step decodes a small window twice, with and without the new token, emits
//! the difference, and holds text back while it ends in an incomplete character (U+FFFD).
use super::Tokenizer;
use crate::error::Result;

const REPLACEMENT: char = '\u{FFFD}';

/// Turns generated token ids into text chunks. The concatenation of every `push` and the final
/// `finish` equals `tokenizer.decode(all_ids, skip_special_tokens)`.
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    /// Ids from the start of the context window on (older ids are dropped).
    ids: Vec<u32>,
    /// `ids[..read]` has been emitted; `ids[..read]` is the context the next decode starts from.
    read: usize,
}

impl StreamDecoder {
    pub(crate) fn new(tokenizer: Tokenizer, skip_special_tokens: bool) -> Self {
        StreamDecoder { tokenizer, skip_special_tokens, ids: Vec::new(), read: 0 }
    }

    /// Adds one token; returns the text it completes (often empty while a character is split).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let (prefix, full) = self.decode_window()?;
        if full.len() <= prefix.len() || full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        // Not a char boundary means the window decoded differently from its prefix; wait for more.
        let Some(new) = full.get(prefix.len()..) else { return Ok(String::new()) };
        let new = new.to_string();
        // The emitted tokens become the next context; older ones are no longer needed.
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        Ok(new)
    }

    /// Flushes held-back text (an incomplete character at the very end comes out as U+FFFD, as
    /// a full decode would render it).
    pub fn finish(&mut self) -> Result<String> {
        if self.read == self.ids.len() {
            return Ok(String::new());
        }
        let (prefix, full) = self.decode_window()?;
        let new = match full.get(prefix.len()..) {
            Some(s) if full.starts_with(&prefix) => s.to_string(),
            _ => full,
        };
        self.ids.clear();
        self.read = 0;
        Ok(new)
    }

    /// Whether tokens were pushed whose text is still held back.
    pub fn has_pending(&self) -> bool {
        self.read < self.ids.len()
    }

    pub fn skip_special_tokens(&self) -> bool {
        self.skip_special_tokens
    }

    fn decode_window(&self) -> Result<(String, String)> {
        let prefix = self.tokenizer.decode(&self.ids[..self.read], self.skip_special_tokens)?;
        let full = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        Ok((prefix, full))
    }
}
