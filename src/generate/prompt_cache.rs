//! The stateless automatic prompt cache: a pool of KV states of earlier calls, keyed by the exact
//! token ids they hold, living on the engine thread.
//!
//! Every call passes its whole transcript; the pool hands back the KV state of the longest token-id
//! prefix any earlier call computed (its own previous turn, or an unrelated conversation that shares
//! a system prompt), trimmed to the shared part. After the call, the prompt plus the generated tokens
//! that were actually fed to the model are stored.
//!
//! Reuse is copy-on-use: an entry's [`KvCache`]s are cloned (handles to the same MLX arrays) and the
//! clones' `offset` trimmed. The pooled arrays are never written: `slice_update` is functional and
//! MLX only reuses an input buffer in place when nothing else references it (`is_donatable`: the
//! array and its data have a use count of 1), which the pooled handle prevents; so the first write
//! after reuse copies the buffer once and the entry stays intact whatever the call does.
//!
//! Eviction: idle TTL (also while the engine idles, so memory comes back without further calls),
//! least-recently-used beyond `max_entries`, and LRU until under `max_bytes`; an entry larger than
//! the whole byte budget is not stored. Near-duplicates are avoided: a new entry that extends an
//! existing one replaces it, and one already covered by an existing entry only refreshes that entry.
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::nn::KvCache;
use crate::session::PromptCacheConfig;
use std::time::Instant;

struct Entry {
    tokens: Vec<u32>,
    caches: Vec<KvCache>,
    last_used: Instant,
    bytes: usize,
}

/// KV state taken from the pool for one call.
pub struct Reuse {
    /// Per-layer caches holding the first `tokens` tokens of the prompt.
    pub caches: Vec<KvCache>,
    pub tokens: usize,
}

pub struct PromptCachePool {
    config: PromptCacheConfig,
    entries: Vec<Entry>,
    bytes: usize,
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCachePool {
    pub fn new(config: PromptCacheConfig) -> Self {
        PromptCachePool { config, entries: vec![], bytes: 0 }
    }

    /// False when the configuration keeps nothing (`max_entries: 0` or `max_bytes: Some(0)`).
    pub fn enabled(&self) -> bool {
        self.config.max_entries > 0 && self.config.max_bytes != Some(0)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of KV buffers held by the pool.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Smallest prompt (and shared prefix) worth caching.
    fn min_tokens(&self) -> usize {
        self.config.min_cacheable_tokens.max(1)
    }

    /// Whether a call with this prompt may read and write the pool (`min_cacheable_tokens`).
    pub fn cacheable(&self, prompt: &[u32]) -> bool {
        self.enabled() && prompt.len() >= self.min_tokens()
    }

    /// When the next entry goes idle past the TTL (None when the pool is empty).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.entries.iter().map(|e| e.last_used + self.config.ttl).min()
    }

    /// Drops entries idle for longer than the TTL; returns how many went.
    pub fn expire(&mut self, now: Instant) -> usize {
        let ttl = self.config.ttl;
        let before = self.entries.len();
        let mut freed = 0;
        self.entries.retain(|e| {
            let keep = now.saturating_duration_since(e.last_used) < ttl;
            if !keep {
                freed += e.bytes;
            }
            keep
        });
        self.bytes -= freed;
        before - self.entries.len()
    }

    fn remove(&mut self, i: usize) {
        let e = self.entries.swap_remove(i);
        self.bytes -= e.bytes;
    }

    /// The KV state of the longest prefix of `prompt` held by an entry, trimmed to that prefix and
    /// to `prompt.len() - 1` (the engine always computes at least the last prompt token).
    /// None when nothing shares at least `min_cacheable_tokens` tokens with `prompt`.
    pub fn lookup(&mut self, prompt: &[u32], now: Instant) -> Option<Reuse> {
        self.expire(now);
        if !self.enabled() || prompt.len() < self.min_tokens() {
            return None;
        }
        let usable = prompt.len() - 1;
        let mut best: Option<(usize, usize)> = None; // (entry, shared tokens)
        for (i, e) in self.entries.iter().enumerate() {
            let n = common_prefix(&e.tokens, prompt).min(usable);
            let better = match best {
                None => true,
                // Ties go to the most recently used entry.
                Some((j, m)) => n > m || (n == m && e.last_used > self.entries[j].last_used),
            };
            if better {
                best = Some((i, n));
            }
        }
        let (i, n) = best?;
        if n < self.min_tokens() {
            return None;
        }
        let entry = &mut self.entries[i];
        entry.last_used = now;
        let mut caches = entry.caches.clone();
        for c in &mut caches {
            c.trim_to(n);
        }
        Some(Reuse { caches, tokens: n })
    }

    /// Stores the KV state `caches` of exactly `tokens` (prompt + fed generated tokens).
    pub fn store(&mut self, tokens: Vec<u32>, caches: Vec<KvCache>, now: Instant) -> Result<()> {
        self.expire(now);
        if !self.enabled() || tokens.len() < self.min_tokens() {
            return Ok(());
        }
        if caches.iter().any(|c| c.offset != tokens.len()) {
            return Ok(()); // not the state of these tokens: never store what cannot be trusted
        }
        // Already covered by an entry that holds these tokens and maybe more: refresh that one.
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(&tokens)) {
            e.last_used = now;
            return Ok(());
        }
        let bytes: usize = caches.iter().map(KvCache::nbytes).sum();
        if self.config.max_bytes.is_some_and(|max| bytes > max) {
            return Ok(());
        }
        // Make sure nothing lazy (and the graph behind it) is kept alive by the pool.
        let state: Vec<&Array> = caches.iter().flat_map(|c| c.state()).collect();
        mlx::eval(&state)?;
        // Entries this one extends are now redundant.
        let mut i = 0;
        while i < self.entries.len() {
            if tokens.starts_with(&self.entries[i].tokens) {
                self.remove(i);
            } else {
                i += 1;
            }
        }
        // Room for the new entry, least recently used first (it fits the byte budget alone).
        while !self.entries.is_empty()
            && (self.entries.len() + 1 > self.config.max_entries
                || self.config.max_bytes.is_some_and(|max| self.bytes + bytes > max))
        {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used).expect("non-empty");
            self.remove(lru);
        }
        self.entries.push(Entry { tokens, caches, last_used: now, bytes });
        self.bytes += bytes;
        Ok(())
    }
}
