//! Helpers shared by the integration tests.
//!
//! Two tiers of fixtures:
//! - the oracle fixtures: tiny random models built, quantized, saved and run by mlx-lm itself
//!   (`tests/oracle/make_fixtures.py`), generated once per change of that script into
//!   `target/oracle-fixtures/`; they need the oracle venv (`scripts/setup-oracle.sh`);
//! - a tiny llama checkpoint written here in Rust (safetensors bytes by hand), so tests of loading
//!   and of bad input need no Python at all.
#![allow(dead_code)]

pub mod oracle_arrays;

use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

use std::time::{Duration, SystemTime};

// ---------------------------------------------------------------------------------------------
// Locations

/// The package root (tests run with it as the working directory, but do not rely on that).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` when set at run time, else found from the test
/// binary's own path (`<target>/<profile>/deps/<test>-<hash>`).
pub fn target_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        return if d.is_absolute() { d } else { repo_root().join(d) };
    }
    let exe = std::env::current_exe().expect("current_exe");
    exe.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "deps"))
        .and_then(|deps| deps.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| repo_root().join("target"))
}

/// True when running in CI (`$CI` set to anything but "", "0" or "false"): there a missing oracle
/// is a failure, not a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").map(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")).unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Skips that say so (tests/common/skip.rs; gguf_convert.rs includes that file alone)

#[path = "skip.rs"]
mod skip_log;
#[allow(unused_imports)]
pub use skip_log::{skip, skip_log, skip_unless_ci};

// ---------------------------------------------------------------------------------------------
// The oracle (mlx-lm in a venv)

/// The oracle venv's python: `$MLEX_ORACLE_VENV/bin/python`, else `./.venv-oracle/bin/python`.
/// None when that file does not exist.
pub fn oracle_python() -> Option<PathBuf> {
    let venv = match std::env::var_os("MLEX_ORACLE_VENV").filter(|v| !v.is_empty()) {
        Some(v) => {
            let v = PathBuf::from(v);
            if v.is_absolute() { v } else { repo_root().join(v) }
        }
        None => repo_root().join(".venv-oracle"),
    };
    let candidates = [venv.join("bin/python"), venv.join("bin/python3"), venv.join("Scripts/python.exe")];
    candidates.into_iter().find(|p| p.is_file())
}

/// [`oracle_python`] for a test that needs it: None (after printing "skipping: no oracle venv")
/// when there is none, except in CI, where a missing oracle fails the test.
pub fn require_oracle(test: &str) -> Option<PathBuf> {
    match oracle_python() {
        Some(p) => Some(p),
        None => {
            skip_unless_ci(test, "no oracle venv (run scripts/setup-oracle.sh or set MLEX_ORACLE_VENV)");
            None
        }
    }
}

/// The fixture generator script.
pub fn make_fixtures_script() -> PathBuf {
    repo_root().join("tests/oracle/make_fixtures.py")
}

/// 64-bit FNV-1a: enough to notice that the generator (or the python running it) changed.
pub fn fnv1a64(chunks: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in chunks {
        for &b in *chunk {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // Separate the chunks so ("ab", "c") and ("a", "bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Removes the lock file when dropped (also on panic).
struct LockGuard(PathBuf);
impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Takes an exclusive lock by creating `path` (create_new is atomic across processes). A lock
/// older than `stale` is taken to be left by a killed process and is broken.
fn acquire_lock(path: &Path, stale: Duration) -> LockGuard {
    let start = SystemTime::now();
    loop {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(mut f) => {
                use std::io::Write;
                let _ = writeln!(f, "{}", std::process::id());
                return LockGuard(path.to_path_buf());
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let age = std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                    .unwrap_or_default();
                if age > stale {
                    eprintln!("breaking stale lock {} ({}s old)", path.display(), age.as_secs());
                    let _ = std::fs::remove_file(path);
                    continue;
                }
                if SystemTime::now().duration_since(start).unwrap_or_default() > stale * 2 {
                    panic!("timed out waiting for {}", path.display());
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("cannot create lock file {}: {e}", path.display()),
        }
    }
}

/// The oracle fixtures of the core family (llama, qwen2, qwen3): see [`family_fixtures_dir`].
pub fn fixtures_dir() -> PathBuf {
    family_fixtures_dir("core")
}

/// The oracle fixtures of one family (`core`, or a module of `tests/oracle/archs/`), generated
/// on first use into `<target>/oracle-fixtures[-<family>]/` and regenerated when
/// `make_fixtures.py`, the family's module (or the oracle python's path) changes. Safe to call
/// from many test threads and test processes at once: one generates (under a lock file, into a
/// temporary directory renamed into place), the others wait and reuse. Panics when there is no
/// oracle venv; check [`require_oracle`] first.
pub fn family_fixtures_dir(family: &str) -> PathBuf {
    static DIRS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, d)) = dirs.iter().find(|(f, _)| f == family) {
        return d.clone();
    }
    let dir = generate_family(family);
    dirs.push((family.to_string(), dir.clone()));
    dir
}

fn generate_family(family: &str) -> PathBuf {
    {
        let python = oracle_python().expect("fixtures_dir() needs the oracle venv (see require_oracle)");
        let script = make_fixtures_script();
        let source = std::fs::read(&script).unwrap_or_else(|e| panic!("reading {}: {e}", script.display()));
        let module = if family == "core" {
            vec![]
        } else {
            let m = repo_root().join(format!("tests/oracle/archs/{family}.py"));
            std::fs::read(&m).unwrap_or_else(|e| panic!("reading {}: {e}", m.display()))
        };
        let stamp = format!("{:016x}", fnv1a64(&[&source, &module, python.to_string_lossy().as_bytes()]));

        let target = target_dir();
        std::fs::create_dir_all(&target).unwrap();
        let name = if family == "core" { "oracle-fixtures".to_string() } else { format!("oracle-fixtures-{family}") };
        let dir = target.join(&name);
        let stamp_file = dir.join(".stamp");
        let fresh = || std::fs::read_to_string(&stamp_file).map(|s| s.trim() == stamp).unwrap_or(false);
        if fresh() {
            return dir;
        }
        let _lock = acquire_lock(&target.join(format!("{name}.lock")), Duration::from_secs(600));
        if fresh() {
            return dir; // another process made them while we waited
        }
        let tmp = target.join(format!("{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        eprintln!("generating oracle fixtures ({family}) with {} into {}", python.display(), dir.display());
        let out = Command::new(&python)
            .arg(&script)
            .arg(&tmp)
            .arg("--family")
            .arg(family)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", python.display()));
        if !out.status.success() {
            let _ = std::fs::remove_dir_all(&tmp);
            panic!(
                "{} {} --family {family} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
                python.display(),
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::fs::write(tmp.join("generate.log"), &out.stderr).unwrap();
        std::fs::write(tmp.join(".stamp"), &stamp).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::rename(&tmp, &dir).unwrap_or_else(|e| panic!("renaming {} into place: {e}", tmp.display()));
        dir
    }
}

/// One case of the oracle fixtures (`<case>/expected.json`).
#[derive(Debug, Clone)]
pub struct OracleCase {
    pub name: String,
    pub dir: PathBuf,
    pub prompt: Vec<u32>,
    pub tokens: Vec<u32>,
    /// mlx-lm's logprob of each chosen token (log-softmax in the model's dtype).
    pub logprobs: Vec<f32>,
    /// The same, from the same logits with the log-softmax taken in float32.
    pub logprobs_f32_head: Vec<f32>,
    /// Top-1 minus top-2 logprob at each step.
    pub margins: Vec<f32>,
    /// "float32" or "bfloat16": the dtype the model computes in (scales' dtype when quantized).
    pub dtype: String,
    pub quantized: bool,
    pub model_type: String,
    /// The prefill chunk the oracle used (None: mlx-lm's default).
    pub prefill_step_size: Option<usize>,
}

fn f32s(v: &Value, key: &str, file: &Path) -> Vec<f32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{}: '{key}' is not a list", file.display()))
        .iter()
        .map(|x| x.as_f64().unwrap_or_else(|| panic!("{}: '{key}' holds a non-number", file.display())) as f32)
        .collect()
}

fn u32s(v: &Value, key: &str, file: &Path) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{}: '{key}' is not a list", file.display()))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("{}: '{key}' holds a non-integer", file.display())) as u32)
        .collect()
}

/// Every case listed in `<fixtures>/index.json`, in its order.
pub fn oracle_cases(fixtures: &Path) -> Vec<OracleCase> {
    let index_path = fixtures.join("index.json");
    let index: Value = serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    index["cases"]
        .as_array()
        .expect("index.json: cases")
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("case name").to_string();
            let dir = fixtures.join(&name);
            let file = dir.join("expected.json");
            let e: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
            let logprobs = f32s(&e, "logprobs", &file);
            let logprobs_f32_head =
                if e.get("logprobs_f32_head").is_some() { f32s(&e, "logprobs_f32_head", &file) } else { logprobs.clone() };
            OracleCase {
                name,
                prompt: u32s(&e, "prompt", &file),
                tokens: u32s(&e, "tokens", &file),
                logprobs,
                logprobs_f32_head,
                margins: f32s(&e, "margins", &file),
                dtype: e["dtype"].as_str().unwrap_or("float32").to_string(),
                quantized: e["quantized"].as_bool().unwrap_or(false),
                model_type: e["model_type"].as_str().unwrap_or("").to_string(),
                prefill_step_size: e["prefill_step_size"].as_u64().map(|n| n as usize),
                dir,
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// safetensors, written by hand

/// One tensor to write: safetensors dtype name ("F32", "U32", …), shape, raw little-endian bytes.
#[derive(Debug, Clone)]
pub struct RawTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl RawTensor {
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
        RawTensor {
            name: name.into(),
            dtype: "F32".into(),
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
    pub fn u32(name: &str, shape: &[usize], values: &[u32]) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len(), "{name}");
        RawTensor {
            name: name.into(),
            dtype: "U32".into(),
            shape: shape.to_vec(),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// The bytes of a safetensors file: 8-byte little-endian header length, the JSON header (padded
/// with spaces to a multiple of 8 so the data is aligned), then the tensors' data back to back.
pub fn safetensors_bytes(tensors: &[RawTensor], metadata: &[(&str, &str)]) -> Vec<u8> {
    let mut header = Map::new();
    if !metadata.is_empty() {
        let m: Map<String, Value> = metadata.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        header.insert("__metadata__".into(), Value::Object(m));
    }
    let mut offset = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.data.len()]}),
        );
        offset += t.data.len();
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    out
}

pub fn write_safetensors(path: &Path, tensors: &[RawTensor]) {
    std::fs::write(path, safetensors_bytes(tensors, &[("format", "mlx")])).unwrap();
}

/// Splits a (well-formed) safetensors file into its header object and its data section.
pub fn read_safetensors_raw(path: &Path) -> (Map<String, Value>, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), bytes[8 + n..].to_vec())
}

/// Rewrites a safetensors file with `edit` applied to its header; the data bytes stay as they are.
pub fn patch_safetensors_header(path: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let (mut header, data) = read_safetensors_raw(path);
    edit(&mut header);
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::new();
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Every tensor of a safetensors file (in offset order), to edit and write back whole.
pub fn read_tensors(path: &Path) -> Vec<RawTensor> {
    let (header, data) = read_safetensors_raw(path);
    let mut ts: Vec<(usize, RawTensor)> = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(name, e)| {
            let b = e["data_offsets"][0].as_u64().unwrap() as usize;
            let end = e["data_offsets"][1].as_u64().unwrap() as usize;
            let shape = e["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            (
                b,
                RawTensor {
                    name: name.clone(),
                    dtype: e["dtype"].as_str().unwrap().to_string(),
                    shape,
                    data: data[b..end].to_vec(),
                },
            )
        })
        .collect();
    ts.sort_by_key(|(b, _)| *b);
    ts.into_iter().map(|(_, t)| t).collect()
}

// ---------------------------------------------------------------------------------------------
// A tiny llama checkpoint written in Rust

/// splitmix64: a deterministic, dependency-free PRNG for test weights.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn uniform(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Shape of the Rust-written tiny llama.
#[derive(Debug, Clone)]
pub struct TinyLlama {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    /// 256 byte tokens + 3 special tokens (see [`tiny_tokenizer_json`]).
    pub vocab: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub seed: u64,
}

impl Default for TinyLlama {
    fn default() -> Self {
        TinyLlama {
            hidden: 32,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 8,
            intermediate: 64,
            vocab: TINY_VOCAB,
            max_position_embeddings: 128,
            tie_word_embeddings: false,
            seed: 0x6d6c_6578,
        }
    }
}

pub const TINY_VOCAB: usize = 259;
pub const TINY_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const TINY_EOS: u32 = 258;

impl TinyLlama {
    pub fn config_json(&self) -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": 1e-5,
            "vocab_size": self.vocab,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": 256,
            "eos_token_id": TINY_EOS,
        })
    }

    /// Every tensor, named as mlx-lm names them, f32, deterministic.
    pub fn tensors(&self) -> Vec<RawTensor> {
        let mut rng = Rng::new(self.seed);
        let (h, q, kv, i) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate);
        let lin = |rng: &mut Rng, name: String, out: usize, inp: usize, gain: f32| {
            let s = gain / (inp as f32).sqrt();
            RawTensor::f32(&name, &[out, inp], &rng.uniform(out * inp, s))
        };
        let mut ts = vec![lin(&mut rng, "model.embed_tokens.weight".into(), self.vocab, h, (h as f32).sqrt())];
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            ts.push(lin(&mut rng, format!("{p}.self_attn.q_proj.weight"), q, h, 2.0));
            ts.push(lin(&mut rng, format!("{p}.self_attn.k_proj.weight"), kv, h, 2.0));
            ts.push(lin(&mut rng, format!("{p}.self_attn.v_proj.weight"), kv, h, 1.0));
            ts.push(lin(&mut rng, format!("{p}.self_attn.o_proj.weight"), h, q, 2.0));
            ts.push(lin(&mut rng, format!("{p}.mlp.gate_proj.weight"), i, h, 1.0));
            ts.push(lin(&mut rng, format!("{p}.mlp.up_proj.weight"), i, h, 1.0));
            ts.push(lin(&mut rng, format!("{p}.mlp.down_proj.weight"), h, i, 2.0));
        }
        let norm = |rng: &mut Rng, name: String| {
            let v: Vec<f32> = (0..h).map(|_| 1.0 + 0.1 * rng.unit()).collect();
            RawTensor::f32(&name, &[h], &v)
        };
        for l in 0..self.layers {
            ts.push(norm(&mut rng, format!("model.layers.{l}.input_layernorm.weight")));
            ts.push(norm(&mut rng, format!("model.layers.{l}.post_attention_layernorm.weight")));
        }
        ts.push(norm(&mut rng, "model.norm.weight".into()));
        if !self.tie_word_embeddings {
            ts.push(lin(&mut rng, "lm_head.weight".into(), self.vocab, h, 3.0));
        }
        ts.sort_by(|a, b| a.name.cmp(&b.name));
        ts
    }

    /// Writes config.json, model.safetensors, tokenizer.json and tokenizer_config.json to `dir`.
    pub fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&self.config_json()).unwrap()).unwrap();
        write_safetensors(&dir.join("model.safetensors"), &self.tensors());
        std::fs::write(dir.join("tokenizer.json"), serde_json::to_string(&tiny_tokenizer_json()).unwrap()).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&tiny_tokenizer_config_json()).unwrap(),
        )
        .unwrap();
    }
}

/// `len` token ids below 256 (the tiny vocabulary's bytes) from a xorshift seeded by `seed`.
pub fn pseudo_random_prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 256) as u32
        })
        .collect()
}

/// Writes the default tiny llama into a fresh temporary directory.
pub fn tiny_llama_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama::default().write(dir.path());
    dir
}

/// The byte-level BPE convention's reversible byte → printable character map.
pub fn bytes_to_unicode() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
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

/// A byte-level BPE tokenizer with no merges: ids 0..=255 are the bytes, 256..=258 the special
/// tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`.
pub fn tiny_tokenizer_json() -> Value {
    let mut vocab = Map::new();
    for (b, c) in bytes_to_unicode().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    let mut added = vec![];
    for (k, s) in TINY_SPECIALS.iter().enumerate() {
        vocab.insert(s.to_string(), json!(256 + k));
        added.push(json!({"id": 256 + k, "content": s, "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}));
    }
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": []}
    })
}

pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

pub fn tiny_tokenizer_config_json() -> Value {
    json!({
        "add_bos_token": false,
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML_TEMPLATE,
        "model_max_length": 128,
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

/// Reads, edits and writes back a JSON file.
pub fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Animated images (a video part given as one file)

/// An animated GIF of `frames` (encoded images, all of one size), each shown `delay_ms`; the
/// encoder quantizes to a palette (lossy beyond 256 colours).
pub fn animated_gif(frames: &[&[u8]], delay_ms: u32) -> Vec<u8> {
    let mut out = vec![];
    {
        let mut enc = image::codecs::gif::GifEncoder::new(&mut out);
        for f in frames {
            let rgba = image::load_from_memory(f).unwrap().to_rgba8();
            enc.encode_frame(image::Frame::from_parts(rgba, 0, 0, image::Delay::from_numer_denom_ms(delay_ms, 1))).unwrap();
        }
    }
    out
}

/// A lossless animated WebP of `frames` (encoded images, all of one size), each shown
/// `delay_ms`: each frame's lossless still (VP8L, from the `image` crate's encoder) in an ANMF
/// chunk.
pub fn animated_webp(frames: &[&[u8]], delay_ms: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
        out.extend(kind);
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(data);
        if data.len() % 2 == 1 {
            out.push(0);
        }
    }
    let u24 = |v: u32| v.to_le_bytes()[..3].to_vec();
    let first = image::load_from_memory(frames[0]).unwrap();
    let (w, h) = (first.width(), first.height());
    let mut body = b"WEBP".to_vec();
    chunk(&mut body, b"VP8X", &[vec![0x02, 0, 0, 0], u24(w - 1), u24(h - 1)].concat());
    chunk(&mut body, b"ANIM", &[255, 255, 255, 255, 0, 0]);
    for f in frames {
        let rgb = image::DynamicImage::ImageRgb8(image::load_from_memory(f).unwrap().to_rgb8());
        let mut still = std::io::Cursor::new(vec![]);
        rgb.write_to(&mut still, image::ImageFormat::WebP).unwrap();
        let still = still.into_inner();
        assert_eq!(&still[12..16], b"VP8L", "a lossless still");
        let mut anmf = [u24(0), u24(0), u24(w - 1), u24(h - 1), u24(delay_ms)].concat();
        anmf.push(0b10);
        anmf.extend(&still[12..]);
        chunk(&mut body, b"ANMF", &anmf);
    }
    let mut out = b"RIFF".to_vec();
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(body);
    out
}
