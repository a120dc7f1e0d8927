//! mlx-lm's KV cache options of a generation: a bounded cache (`max_kv_size`) and a quantized
//! one (`kv_bits`, `kv_group_size`, `quantized_kv_start`), as `mlx_lm.generate` takes them. Read
//! and checked here for [`super::GenerateOptions`]; the caches are in `nn::bounded_kv_cache` and
//! `nn::quantized_kv_cache`.
//!
//! A request that sets `max_kv_size` or `kv_bits` gets caches of its own: it runs alone, outside
//! the continuous batch (`usage.batched` false), and does not use the prompt cache (neither reads
//! nor writes it: a bounded cache that dropped tokens cannot be taken back to a shared prefix,
//! and a quantized one holds other numbers than a plain request would compute).
use crate::nn::bounded_kv_cache::KEEP_FIRST;
use crate::nn::KvCacheKind;
use crate::schema::Fields;

/// mlx-lm's default `kv_group_size`.
pub const DEFAULT_KV_GROUP_SIZE: u32 = 64;
/// mlx-lm's default `quantized_kv_start` (`DEFAULT_QUANTIZED_KV_START`).
pub const DEFAULT_QUANTIZED_KV_START: usize = 5000;

/// The KV cache options of one generation. All None: the model's own caches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCacheOptions {
    /// Hold at most this many tokens per layer: the first 4 and the most recent ones (mlx-lm's
    /// `max_kv_size`, its `RotatingKVCache` with `keep=4`). Generation can then go on past the
    /// model's context length.
    pub max_kv_size: Option<usize>,
    /// Quantize keys and values to this many bits (mlx-lm's `kv_bits`: 2, 3, 4, 5, 6 or 8), read
    /// by quantized attention.
    pub kv_bits: Option<u32>,
    /// Elements per quantization group along the head dimension (32, 64 or 128; default 64).
    pub kv_group_size: Option<u32>,
    /// Tokens held in full precision before the cache switches to quantized (default 5000, as
    /// mlx-lm's; 0: from the first forward pass on).
    pub quantized_kv_start: Option<usize>,
}

/// The options' names (snake_case), part of [`super::GenerateOptions::FIELDS`].
pub const FIELDS: [&str; 4] = ["max_kv_size", "kv_bits", "kv_group_size", "quantized_kv_start"];

impl KvCacheOptions {
    /// Reads the options from `f` (see [`super::GenerateOptions::from_json`]).
    pub(crate) fn read(f: &Fields) -> Result<KvCacheOptions, String> {
        let small = |name: &str| -> Result<Option<u32>, String> {
            f.count(name)?.map(|n| u32::try_from(n).map_err(|_| format!("{} is too large: {n}", f.name(name)))).transpose()
        };
        Ok(KvCacheOptions {
            max_kv_size: f.count("max_kv_size")?,
            kv_bits: small("kv_bits")?,
            kv_group_size: small("kv_group_size")?,
            quantized_kv_start: f.count("quantized_kv_start")?,
        })
    }

    /// Rejects values no cache could honour, naming the option (snake_case).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(n) = self.max_kv_size.filter(|&n| n <= KEEP_FIRST) {
            return Err(format!("max_kv_size must be greater than {KEEP_FIRST} (the first {KEEP_FIRST} tokens are always kept), got {n}"));
        }
        if let Some(b) = self.kv_bits.filter(|b| !matches!(b, 2 | 3 | 4 | 5 | 6 | 8)) {
            return Err(format!("kv_bits must be 2, 3, 4, 5, 6 or 8, got {b}"));
        }
        if let Some(g) = self.kv_group_size.filter(|g| !matches!(g, 32 | 64 | 128)) {
            return Err(format!("kv_group_size must be 32, 64 or 128, got {g}"));
        }
        if self.max_kv_size.is_some() && self.kv_bits.is_some() {
            // mlx-lm's RotatingKVCache has no quantized form either.
            return Err("max_kv_size and kv_bits cannot be combined (a bounded cache is not quantized)".into());
        }
        Ok(())
    }

    /// The cache these options ask for; None: the model's own.
    pub fn kind(&self) -> Option<KvCacheKind> {
        if let Some(max_size) = self.max_kv_size {
            return Some(KvCacheKind::Bounded { max_size, keep: KEEP_FIRST });
        }
        self.kv_bits.map(|bits| KvCacheKind::Quantized {
            bits,
            group_size: self.kv_group_size.unwrap_or(DEFAULT_KV_GROUP_SIZE),
            start: self.quantized_kv_start.unwrap_or(DEFAULT_QUANTIZED_KV_START),
        })
    }

    /// Whether the request needs caches of its own (then it runs alone, without the prompt
    /// cache). `kv_group_size` and `quantized_kv_start` alone change nothing (as in mlx-lm).
    pub fn runs_alone(&self) -> bool {
        self.kind().is_some()
    }

    /// The option that asks for these caches (for messages), by its snake_case name.
    pub fn option_name(&self) -> &'static str {
        if self.max_kv_size.is_some() {
            "max_kv_size"
        } else {
            "kv_bits"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{GenerateOptions, Naming};
    use serde_json::json;

    fn err(v: serde_json::Value, n: Naming) -> String {
        GenerateOptions::from_json(&v, n).unwrap_err()
    }

    #[test]
    fn reads_and_defaults() {
        let o = GenerateOptions::from_json(&json!({"maxKvSize": 64}), Naming::Camel).unwrap();
        assert_eq!(o.kv_cache.max_kv_size, Some(64));
        assert_eq!(o.kv_cache.kind(), Some(KvCacheKind::Bounded { max_size: 64, keep: 4 }));
        let o = GenerateOptions::from_json(&json!({"kv_bits": 8}), Naming::Snake).unwrap();
        assert_eq!(o.kv_cache.kind(), Some(KvCacheKind::Quantized { bits: 8, group_size: 64, start: 5000 }));
        assert!(o.kv_cache.runs_alone());
        // Without kv_bits the quantization settings change nothing (as in mlx-lm).
        let o = GenerateOptions::from_json(&json!({"--kv-group-size": 32, "--quantized-kv-start": 0}), Naming::Kebab).unwrap();
        assert_eq!(o.kv_cache.kind(), None);
        assert!(!o.kv_cache.runs_alone());
        assert_eq!(GenerateOptions::default().kv_cache.kind(), None);
    }

    #[test]
    fn refusals_name_the_option() {
        assert_eq!(
            err(json!({"maxKvSize": 4}), Naming::Camel),
            "maxKvSize must be greater than 4 (the first 4 tokens are always kept), got 4"
        );
        assert_eq!(err(json!({"--kv-bits": 7}), Naming::Kebab), "--kv-bits must be 2, 3, 4, 5, 6 or 8, got 7");
        assert_eq!(err(json!({"kvBits": 4, "kvGroupSize": 48}), Naming::Camel), "kvGroupSize must be 32, 64 or 128, got 48");
        assert!(err(json!({"maxKvSize": 64, "kvBits": 4}), Naming::Camel).starts_with("maxKvSize and kvBits cannot be combined"));
        assert!(err(json!({"max_kv_size": -1}), Naming::Snake).starts_with("max_kv_size must be a non-negative integer"));
        assert!(err(json!({"quantizedKvStart": "soon"}), Naming::Camel).starts_with("quantizedKvStart must be"));
    }
}
