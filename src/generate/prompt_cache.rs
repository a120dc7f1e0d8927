//! The stateless automatic prompt cache: a pool of KV states of earlier calls, keyed by the exact
//! token ids they hold, living on the engine thread.
//!
//! Every call passes its whole transcript; the pool hands back the KV state of the longest token-id
//! prefix any earlier call computed (its own previous turn, or an unrelated conversation that shares
//! a system prompt), trimmed to the shared part. After the call, the prompt plus the generated tokens
//! that were actually fed to the model are stored.
//!
//! Reuse is copy-on-use: an entry's [`LayerCaches`] are cloned (handles to the same MLX arrays) and the
//! clones' `offset` trimmed. The pooled arrays are never written: `slice_update` is functional and
//! MLX only reuses an input buffer in place when nothing else references it (`is_donatable`: the
//! array and its data have a use count of 1), which the pooled handle prevents; so the first write
//! after reuse copies the buffer once and the entry stays intact whatever the call does.
//!
//! Eviction: idle TTL (also while the engine idles, so memory comes back without further calls),
//! least-recently-used beyond `max_entries`, and LRU until under `max_bytes`; an entry larger than
//! the whole byte budget is not stored. Near-duplicates are avoided: a new entry that extends an
//! existing one replaces it, and one already covered by an existing entry only refreshes that entry.
//!
//! With `dir` set, entries also go to disk (`generate::prompt_disk`), written after the reply
//! went out ([`PromptCachePool::persist`]), and a lookup that finds a longer prefix on disk than
//! in memory (a new process, an evicted entry) loads that entry into the pool and goes on as
//! with any hit.
//!
//! Recurrent states (hybrid and state-space models, `nn::StateCache`) cannot be trimmed: an entry
//! serves only prompts that extend all of it. So for such models the engine also stores a
//! snapshot where each prompt ends (its last token excluded), and an entry that extends another
//! does not replace it: a next turn whose history re-renders the reply differently still resumes
//! from the previous prompt. Snapshots count against the byte budget like any entry.
use super::prompt_disk::{DiskCache, DEFAULT_DISK_MAX_BYTES};
use crate::error::Result;
use crate::mlx::{self, Array};
use crate::nn::LayerCaches;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Settings of the automatic prompt cache: a pool of KV states of earlier calls on the engine
/// thread; each call reuses the longest token-id prefix any earlier call computed
/// (this module). `max_entries: 0` turns it off.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptCacheConfig {
    /// Most cached prefixes kept.
    pub max_entries: usize,
    /// An entry unused for this long is dropped.
    pub ttl: Duration,
    /// Prompts shorter than this are not worth caching.
    pub min_cacheable_tokens: usize,
    /// Upper bound on the bytes of KV state kept. None: [`default_max_bytes`], a quarter of what
    /// MLX may still allocate once the model is loaded (its memory limit, derived from the
    /// device's memory, less the bytes already in use); `usize::MAX` for no bound.
    pub max_bytes: Option<usize>,
    /// A directory where entries are also kept on disk, for other processes (and later runs) to
    /// reuse (`generate::prompt_disk`). None: memory only.
    pub dir: Option<PathBuf>,
    /// Upper bound on the bytes of entries in `dir` (every model's together), least recently
    /// used deleted first. Default [`DEFAULT_DISK_MAX_BYTES`] (4 GiB).
    pub disk_max_bytes: u64,
}

/// The prompt cache's byte budget when [`PromptCacheConfig::max_bytes`] is None: a quarter of
/// MLX's memory limit (which MLX derives from the device's memory: the recommended working set
/// on Metal, the system RAM on CPU and CUDA) less what is already allocated (the weights), so
/// sixteen long contexts of a large model cannot take a laptop's memory. At least 64 MiB.
pub fn default_max_bytes() -> usize {
    let limit = mlx::memory_limit();
    let used = mlx::memory_stats().active;
    (limit.saturating_sub(used) / 4).max(64 << 20)
}

impl Default for PromptCacheConfig {
    fn default() -> Self {
        PromptCacheConfig {
            max_entries: 16,
            ttl: Duration::from_secs(300),
            min_cacheable_tokens: 8,
            max_bytes: None,
            dir: None,
            disk_max_bytes: DEFAULT_DISK_MAX_BYTES,
        }
    }
}

struct Entry {
    tokens: Vec<u32>,
    caches: LayerCaches,
    last_used: Instant,
    bytes: usize,
}

/// An entry stored in memory, waiting to be written to disk ([`PromptCachePool::persist`]).
struct Pending {
    tokens: Vec<u32>,
    caches: LayerCaches,
}

/// KV state taken from the pool for one call.
pub struct Reuse {
    /// Per-layer caches holding the first `tokens` tokens of the prompt.
    pub caches: LayerCaches,
    pub tokens: usize,
}

pub struct PromptCachePool {
    config: PromptCacheConfig,
    entries: Vec<Entry>,
    bytes: usize,
    /// `config.max_bytes`, or [`default_max_bytes`] when that is None.
    max_bytes: usize,
    /// The entries on disk (`config.dir`), once attached ([`PromptCachePool::attach_disk`]).
    disk: Option<DiskCache>,
    /// Entries stored since the last [`PromptCachePool::persist`].
    pending: Vec<Pending>,
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PromptCachePool {
    pub fn new(config: PromptCacheConfig) -> Self {
        let max_bytes = config.max_bytes.unwrap_or_else(default_max_bytes);
        PromptCachePool { config, entries: vec![], bytes: 0, max_bytes, disk: None, pending: vec![] }
    }

    /// Keeps entries on disk too, in `disk` (see `generate::prompt_disk`).
    pub fn attach_disk(&mut self, disk: DiskCache) {
        self.disk = Some(disk);
    }

    /// Writes the entries stored since the last call to disk (the arrays are copied here, the
    /// file is written by the disk cache's own thread). The engine calls this once the replies
    /// are out, so that the copy does not delay a first token. A failure only costs reuse.
    pub fn persist(&mut self) {
        let Some(disk) = &mut self.disk else { return };
        for p in std::mem::take(&mut self.pending) {
            if let Err(e) = disk.save(&p.tokens, &p.caches) {
                eprintln!("mlex: prompt cache on disk: not saved: {e}");
            }
        }
    }

    /// How many entries wait for [`PromptCachePool::persist`].
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// False when the configuration keeps nothing (`max_entries: 0` or `max_bytes: Some(0)`).
    pub fn enabled(&self) -> bool {
        self.config.max_entries > 0 && self.max_bytes != 0
    }

    /// The byte budget in force (`max_bytes`, or the default derived from the device's memory).
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
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
            // A state that cannot be brought back to the shared prefix (a sliding window that
            // moved past it) is of no use for this prompt.
            if !e.caches.can_trim_to(n) {
                continue;
            }
            let better = match best {
                None => true,
                // Ties go to the most recently used entry.
                Some((j, m)) => n > m || (n == m && e.last_used > self.entries[j].last_used),
            };
            if better {
                best = Some((i, n));
            }
        }
        let in_memory = best.map_or(0, |(_, n)| n);
        if let Some(reuse) = self.lookup_disk(prompt, usable, in_memory, now) {
            return Some(reuse);
        }
        let (i, n) = best?;
        if n < self.min_tokens() {
            return None;
        }
        let entry = &mut self.entries[i];
        entry.last_used = now;
        let mut caches = entry.caches.clone();
        caches.trim_to(n).ok()?;
        Some(Reuse { caches, tokens: n })
    }

    /// The state of a prefix of `prompt` longer than `in_memory` tokens from disk, if any: the
    /// entry joins the pool (as if stored, not written again) and a trimmed copy is handed out.
    fn lookup_disk(&mut self, prompt: &[u32], usable: usize, in_memory: usize, now: Instant) -> Option<Reuse> {
        let min = self.min_tokens();
        if in_memory >= usable {
            return None; // nothing on disk can do better
        }
        let disk = self.disk.as_mut()?;
        let (name, n) = disk.best(prompt, usable)?;
        if n <= in_memory || n < min {
            return None;
        }
        let (tokens, caches) = disk.load(&name)?;
        let mut copy = caches.clone();
        copy.trim_to(n).ok()?;
        let _ = self.store_entry(tokens, caches, now, false);
        Some(Reuse { caches: copy, tokens: n })
    }

    /// Stores the KV state `caches` of exactly `tokens` (prompt + fed generated tokens).
    pub fn store(&mut self, tokens: Vec<u32>, caches: LayerCaches, now: Instant) -> Result<()> {
        self.store_entry(tokens, caches, now, true)
    }

    /// [`PromptCachePool::store`]; `to_disk`: also queue it for the disk.
    fn store_entry(&mut self, tokens: Vec<u32>, caches: LayerCaches, now: Instant, to_disk: bool) -> Result<()> {
        self.expire(now);
        if !self.enabled() || tokens.len() < self.min_tokens() {
            return Ok(());
        }
        if caches.0.iter().any(|c| c.offset() != tokens.len()) {
            return Ok(()); // not the state of these tokens: never store what cannot be trusted
        }
        // Already covered by an entry that holds these tokens and maybe more (and can be taken
        // back to them): refresh that one.
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens.starts_with(&tokens) && e.caches.can_trim_to(tokens.len())) {
            e.last_used = now;
            return Ok(());
        }
        let bytes = caches.nbytes();
        if bytes > self.max_bytes {
            return Ok(());
        }
        // Make sure nothing lazy (and the graph behind it) is kept alive by the pool.
        let state: Vec<&Array> = caches.state();
        if !state.is_empty() {
            mlx::eval(&state)?;
        }
        // Entries this one extends are now redundant — unless this state cannot be taken back to
        // where they end (a recurrent state): then they stay, as snapshots to resume from.
        let mut i = 0;
        while i < self.entries.len() {
            if tokens.starts_with(&self.entries[i].tokens) && caches.can_trim_to(self.entries[i].tokens.len()) {
                self.remove(i);
            } else {
                i += 1;
            }
        }
        // Room for the new entry, least recently used first (it fits the byte budget alone).
        while !self.entries.is_empty()
            && (self.entries.len() + 1 > self.config.max_entries
                || self.bytes + bytes > self.max_bytes)
        {
            let lru = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used).expect("non-empty");
            self.remove(lru);
        }
        if to_disk && self.disk.is_some() {
            // Entries this one extends are dropped (their files too, once it is written).
            self.pending.retain(|p| !(tokens.starts_with(&p.tokens) && caches.can_trim_to(p.tokens.len())));
            self.pending.push(Pending { tokens: tokens.clone(), caches: caches.clone() });
        }
        self.entries.push(Entry { tokens, caches, last_used: now, bytes });
        self.bytes += bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The pool's bookkeeping, with caches that hold no arrays (no MLX involved); the KV side is
    //! covered by tests/prompt_cache.rs.
    use super::*;
    use crate::nn::{Cache, KvCache};
    use std::time::Duration;

    fn caches(n: usize) -> LayerCaches {
        LayerCaches(
            (0..2)
                .map(|_| {
                    let mut c = KvCache::new();
                    c.offset = n;
                    Box::new(c) as Box<dyn Cache>
                })
                .collect(),
        )
    }

    fn pool(max_entries: usize, min: usize) -> PromptCachePool {
        PromptCachePool::new(PromptCacheConfig { max_entries, min_cacheable_tokens: min, ..Default::default() })
    }

    fn put(p: &mut PromptCachePool, tokens: &[u32], now: Instant) {
        p.store(tokens.to_vec(), caches(tokens.len()), now).unwrap();
    }

    fn seqs(p: &PromptCachePool) -> Vec<Vec<u32>> {
        let mut v: Vec<_> = p.entries.iter().map(|e| e.tokens.clone()).collect();
        v.sort();
        v
    }

    #[test]
    fn the_longest_shared_prefix_wins_trimmed_and_at_least_one_token_is_left() {
        let now = Instant::now();
        let mut p = pool(16, 2);
        put(&mut p, &[1, 2, 3, 4, 5, 6], now);
        put(&mut p, &[1, 2, 9, 9], now);
        let r = p.lookup(&[1, 2, 3, 4, 7, 7], now).unwrap();
        assert_eq!(r.tokens, 4);
        assert!(r.caches.0.iter().all(|c| c.offset() == 4));
        // The entry itself is untouched by trimming the copy.
        assert!(p.entries.iter().any(|e| e.caches.0.iter().all(|c| c.offset() == 6)));
        // A strict prefix of an entry, and the entry's exact tokens: all but the last token.
        assert_eq!(p.lookup(&[1, 2, 3], now).unwrap().tokens, 2);
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5, 6], now).unwrap().tokens, 5);
        // Below the minimum shared prefix, or a prompt below the minimum: nothing.
        assert!(p.lookup(&[1, 5, 5, 5], now).is_none());
        assert!(p.lookup(&[1], now).is_none());
    }

    #[test]
    fn extensions_replace_their_prefix_and_covered_states_are_not_stored_again() {
        let now = Instant::now();
        let mut p = pool(16, 1);
        put(&mut p, &[1, 2, 3], now);
        put(&mut p, &[1, 2, 3, 4, 5], now);
        assert_eq!(seqs(&p), vec![vec![1, 2, 3, 4, 5]]);
        put(&mut p, &[1, 2, 3, 4], now);
        assert_eq!(seqs(&p), vec![vec![1, 2, 3, 4, 5]]);
        put(&mut p, &[1, 2, 7], now);
        assert_eq!(seqs(&p), vec![vec![1, 2, 3, 4, 5], vec![1, 2, 7]]);
        // A state whose caches do not hold exactly these tokens is refused.
        p.store(vec![5, 5, 5], caches(2), now).unwrap();
        assert_eq!(p.len(), 2);
    }

    #[test]
    fn least_recently_used_entries_go_first() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut p = pool(2, 1);
        put(&mut p, &[1, 1], at(0));
        put(&mut p, &[2, 2], at(1));
        assert!(p.lookup(&[1, 1, 0], at(2)).is_some()); // 1 is now the most recent
        put(&mut p, &[3, 3], at(3));
        assert_eq!(seqs(&p), vec![vec![1, 1], vec![3, 3]]);
    }

    #[test]
    fn idle_entries_expire_after_the_ttl() {
        let t0 = Instant::now();
        let mut p = PromptCachePool::new(PromptCacheConfig { ttl: Duration::from_secs(10), min_cacheable_tokens: 1, ..Default::default() });
        assert_eq!(p.next_expiry(), None);
        put(&mut p, &[1, 1], t0);
        put(&mut p, &[2, 2], t0 + Duration::from_secs(5));
        assert_eq!(p.next_expiry(), Some(t0 + Duration::from_secs(10)));
        assert_eq!(p.expire(t0 + Duration::from_secs(9)), 0);
        assert_eq!(p.expire(t0 + Duration::from_secs(10)), 1);
        assert!(p.lookup(&[1, 1, 1], t0 + Duration::from_secs(11)).is_none());
        assert!(p.lookup(&[2, 2, 2], t0 + Duration::from_secs(14)).is_some()); // refreshed
        assert!(p.lookup(&[2, 2, 2], t0 + Duration::from_secs(23)).is_some());
        assert!(p.lookup(&[2, 2, 2], t0 + Duration::from_secs(34)).is_none());
        assert!(p.is_empty());
    }

    #[test]
    fn a_disabled_pool_keeps_nothing() {
        let now = Instant::now();
        let mut p = pool(0, 1);
        put(&mut p, &[1, 2, 3], now);
        assert!(p.is_empty() && !p.enabled());
        let mut p = PromptCachePool::new(PromptCacheConfig { max_bytes: Some(0), ..Default::default() });
        assert!(!p.enabled());
        put(&mut p, &[1; 20], now);
        assert!(p.is_empty());
    }

    /// A hybrid model's caches holding `n` tokens: a KV cache and a recurrent state.
    fn hybrid(n: usize) -> LayerCaches {
        let mut kv = KvCache::new();
        kv.offset = n;
        let mut state = crate::nn::StateCache::new(2);
        state.advance(n);
        LayerCaches(vec![Box::new(kv), Box::new(state)])
    }

    #[test]
    fn recurrent_states_are_reused_only_where_a_snapshot_ends() {
        let now = Instant::now();
        let mut p = pool(8, 4);
        let prompt: Vec<u32> = (1..=10).collect();
        // The engine stores the snapshot at the prompt's end, then prompt + reply.
        p.store(prompt[..9].to_vec(), hybrid(9), now).unwrap();
        let mut full = prompt.clone();
        full.extend([50, 51, 52]);
        p.store(full.clone(), hybrid(13), now).unwrap();
        // The longer entry does not replace the snapshot: it cannot be taken back to it.
        assert_eq!(seqs(&p).len(), 2);

        // A next turn extending the whole transcript resumes from its end.
        let mut next = full.clone();
        next.extend([60, 61]);
        assert_eq!(p.lookup(&next, now).unwrap().tokens, 13);
        // One whose history differs after the prompt (a re-rendered reply) resumes from the snapshot.
        let mut rerendered = prompt.clone();
        rerendered.extend([70, 71, 72]);
        let r = p.lookup(&rerendered, now).unwrap();
        assert_eq!(r.tokens, 9);
        assert!(r.caches.0.iter().all(|c| c.offset() == 9));
        // One that leaves the transcript inside the prompt finds no state it can use.
        let mut early = prompt[..6].to_vec();
        early.extend([80, 81, 82, 83]);
        assert!(p.lookup(&early, now).is_none());
        // Storing a prefix of an entry that cannot be trimmed to it is a new entry, not a refresh.
        p.store(full[..11].to_vec(), hybrid(11), now).unwrap();
        assert_eq!(seqs(&p).len(), 3);
    }

    #[test]
    fn the_byte_budget_defaults_to_a_share_of_the_device_memory() {
        let p = pool(16, 2);
        let limit = mlx::memory_limit();
        assert!(p.max_bytes() >= 64 << 20, "default budget {}", p.max_bytes());
        if limit > 256 << 20 {
            assert!(p.max_bytes() <= limit / 4, "default budget {} vs MLX memory limit {limit}", p.max_bytes());
        }
        let explicit = PromptCachePool::new(PromptCacheConfig { max_bytes: Some(1000), ..Default::default() });
        assert_eq!(explicit.max_bytes(), 1000);
        let off = PromptCachePool::new(PromptCacheConfig { max_bytes: Some(0), ..Default::default() });
        assert!(!off.enabled());
    }
}
