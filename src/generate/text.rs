//! Token ids → streamed text: incremental detokenization plus stop strings, which are held
//! back while they might still be forming so that they never reach the caller.
use crate::error::Result;
use crate::tokenizer::{StreamDecoder, Tokenizer};

pub struct TextStream {
    decoder: Option<StreamDecoder>,
    stop: Vec<String>,
    /// Everything emitted so far.
    pub text: String,
    /// Decoded but not yet emitted (could be the start of a stop string).
    pending: String,
}

/// What one token contributed.
pub struct TextDelta {
    pub text: String,
    /// A stop string was completed: generation ends, the stop string is dropped.
    pub stopped: bool,
}

impl TextStream {
    pub fn new(tokenizer: Option<&Tokenizer>, stop: &[String]) -> Self {
        TextStream {
            decoder: tokenizer.map(|t| t.stream_decoder()),
            stop: stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
            text: String::new(),
            pending: String::new(),
        }
    }

    pub fn push(&mut self, id: u32) -> Result<TextDelta> {
        let piece = match &mut self.decoder {
            Some(d) => d.push(id)?,
            None => String::new(),
        };
        Ok(self.accept(piece, false))
    }

    /// Flushes what the decoder and the stop-string hold-back kept.
    pub fn finish(&mut self) -> Result<TextDelta> {
        let piece = match &mut self.decoder {
            Some(d) => d.finish()?,
            None => String::new(),
        };
        Ok(self.accept(piece, true))
    }

    /// Whether text of pushed tokens is still held back (an incomplete character, a possible
    /// stop string): it will come out with a later token or at `finish`.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || self.decoder.as_ref().is_some_and(|d| d.has_pending())
    }

    fn accept(&mut self, piece: String, last: bool) -> TextDelta {
        self.pending.push_str(&piece);
        // A complete stop string: emit what precedes it and end.
        if let Some(pos) = self.stop.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            let out: String = self.pending[..pos].to_string();
            self.pending.clear();
            self.text.push_str(&out);
            return TextDelta { text: out, stopped: true };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let hold = if last { 0 } else { self.held_tail_len() };
        let cut = self.pending.len() - hold;
        let out: String = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        self.text.push_str(&out);
        TextDelta { text: out, stopped: false }
    }

    fn held_tail_len(&self) -> usize {
        let p = &self.pending;
        let mut best = 0;
        for s in &self.stop {
            for (i, _) in s.char_indices().skip(1) {
                let prefix = &s[..i];
                if i > best && p.ends_with(prefix) {
                    best = i;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(stop: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut t = TextStream::new(None, &stop.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let mut out = String::new();
        for p in pieces {
            let d = t.accept(p.to_string(), false);
            out.push_str(&d.text);
            if d.stopped {
                return (out, true);
            }
        }
        out.push_str(&t.accept(String::new(), true).text);
        (out, false)
    }

    #[test]
    fn stop_string_split_across_tokens_never_leaks() {
        assert_eq!(feed(&["END"], &["Hello E", "N", "D more"]), ("Hello ".to_string(), true));
    }

    #[test]
    fn held_prefix_is_released_when_it_does_not_complete() {
        assert_eq!(feed(&["END"], &["a E", "x"]), ("a Ex".to_string(), false));
    }

    #[test]
    fn multibyte_stop_strings() {
        assert_eq!(feed(&["é!"], &["caf", "é", "!"]), ("caf".to_string(), true));
    }
}
