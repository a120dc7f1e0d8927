//! The state of a recurrent layer (gated delta-net linear attention, Mamba2; mlx-lm's
//! `ArraysCache`): a few arrays — a short convolution window, a recurrent state matrix — that
//! each step replaces rather than extends. Unlike keys and values, such a state cannot be taken
//! back to an earlier position: it can only be "trimmed" to exactly what it holds, so the prompt
//! cache reuses it only where a stored snapshot ends (see `generate::prompt_cache`).
use super::cache::{Cache, SavedCache};
use crate::error::{Error, Result};
use crate::mlx::Array;

#[derive(Clone, Default)]
pub struct StateCache {
    /// The layer's state arrays, by slot (None until the first step writes them).
    pub states: Vec<Option<Array>>,
    /// Tokens consumed.
    offset: usize,
}

impl StateCache {
    /// A cache of `slots` state arrays.
    pub fn new(slots: usize) -> Self {
        StateCache { states: vec![None; slots], offset: 0 }
    }

    pub fn get(&self, slot: usize) -> Option<&Array> {
        self.states.get(slot).and_then(|s| s.as_ref())
    }

    pub fn set(&mut self, slot: usize, value: Array) {
        self.states[slot] = Some(value);
    }

    /// Counts `n` more tokens consumed (after the layer wrote its new state).
    pub fn advance(&mut self, n: usize) {
        self.offset += n;
    }
}

impl Cache for StateCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn can_trim_to(&self, n: usize) -> bool {
        n == self.offset
    }

    fn trim_to(&mut self, n: usize) -> Result<()> {
        if n != self.offset {
            return Err(Error::Mlx(format!(
                "a recurrent state holds {} tokens and cannot be taken back to {n}",
                self.offset
            )));
        }
        Ok(())
    }

    fn state(&self) -> Vec<&Array> {
        self.states.iter().flatten().collect()
    }

    fn is_recurrent(&self) -> bool {
        true
    }

    fn boxed_clone(&self) -> Box<dyn Cache> {
        Box::new(self.clone())
    }

    fn as_state(&mut self) -> Option<&mut StateCache> {
        Some(self)
    }

    /// Kind `"state"`, ints `[offset]`, arrays the slots.
    fn save(&self) -> Result<Option<SavedCache>> {
        Ok(Some(SavedCache { kind: "state".into(), ints: vec![self.offset], arrays: self.states.clone() }))
    }

    fn restore(&mut self, saved: SavedCache) -> Result<()> {
        match (saved.kind.as_str(), saved.ints.as_slice()) {
            ("state", &[offset]) if saved.arrays.len() == self.states.len() => {
                *self = StateCache { states: saved.arrays, offset };
                Ok(())
            }
            _ => Err(saved.mismatch(format!("expected a recurrent state of {} slots", self.states.len()))),
        }
    }
}
