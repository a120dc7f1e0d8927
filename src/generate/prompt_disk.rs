//! The prompt cache on disk (`promptCache.dir`): entries of the in-memory pool
//! (`generate::prompt_cache`) written as safetensors files, so that another process (the next
//! `mlex generate`, a restarted server) starts from the KV state of a long shared prefix instead
//! of computing it again.
//!
//! One entry is one file `pc-<model>-<tokens>.safetensors`: each layer's state arrays
//! (`layers.<i>.<j>`) and, in the header's metadata, the format version, the model fingerprint
//! (config.json, the weight files' names, sizes, times and first/last bytes, the compute dtype
//! and the device: a different model or quantization never reads another's entries), the
//! token ids held, the fewest tokens the state can be trimmed back to, and the layer layout.
//!
//! Files are written by a thread of their own from bytes the engine thread copied out (the
//! engine does that after the reply went out), to a temporary name then renamed, so a reader
//! never sees half a file; two processes may share a directory. Files that are truncated,
//! corrupt, of another format version or layout are skipped with a warning, never trusted. The
//! directory is kept under its byte bound by deleting the least recently used entries (the
//! file's modification time, refreshed on every read), whatever model wrote them.
//!
//! Persisted: plain key/value caches, sliding-window caches and recurrent states (a recurrent
//! entry serves only prompts that extend all of it, as in memory). Caches of other kinds (the
//! per-request quantized and bounded caches, which never enter the pool) are not written.
use crate::error::{Error, Result};
use crate::loader::safetensors::SafetensorsFile;
use crate::mlx::{Device, Dtype};
use crate::nn::{LayerCaches, SavedCache};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::time::{Duration, SystemTime};

/// Bumped whenever what a file holds or means changes: files of other versions are skipped.
pub const FORMAT_VERSION: u32 = 1;

/// The directory's byte bound unless `disk_max_bytes` says otherwise.
pub const DEFAULT_DISK_MAX_BYTES: u64 = 4 << 30;

/// Writes queued at once; more are dropped (the engine never waits for the disk).
const QUEUE: usize = 4;

/// A temporary file older than this was left by a process that died mid-write.
const STALE_TMP: Duration = Duration::from_secs(3600);

/// 64-bit FNV-1a over `chunks` (each chunk terminated so that ("ab","c") and ("a","bc") differ).
fn fnv1a(h: &mut u64, chunk: &[u8]) {
    for &b in chunk.iter().chain(&[0xff]) {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
}

const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// What identifies a model's KV states: config.json, every weight file's name, size,
/// modification time and first and last 64 KiB, the compute dtype and the device.
pub fn fingerprint(model_dir: &Path, dtype: Dtype, device: Device, int8_activations: bool) -> Result<String> {
    let mut h = FNV_START;
    fnv1a(&mut h, format!("mlex prompt cache v{FORMAT_VERSION} {} {}", dtype.name(), device.as_str()).as_bytes());
    if int8_activations {
        // Other numerics, other KV states (LoadOptions::int8_activations).
        fnv1a(&mut h, b" int8 activations");
    }
    let config = model_dir.join("config.json");
    let bytes = std::fs::read(&config).map_err(|e| Error::io(format!("reading {}", config.display()), e))?;
    fnv1a(&mut h, &bytes);
    let read_dir = |e| Error::io(format!("listing {}", model_dir.display()), e);
    let mut weights: Vec<PathBuf> = std::fs::read_dir(model_dir)
        .map_err(read_dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors" || x == "gguf"))
        .collect();
    weights.sort();
    for p in weights {
        let meta = std::fs::metadata(&p).map_err(|e| Error::io(format!("reading {}", p.display()), e))?;
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).unwrap_or_default();
        fnv1a(&mut h, p.file_name().map(|n| n.as_encoded_bytes()).unwrap_or_default());
        fnv1a(&mut h, format!("{} {}", meta.len(), mtime.as_nanos()).as_bytes());
        fnv1a(&mut h, &ends(&p, meta.len()).map_err(|e| Error::io(format!("reading {}", p.display()), e))?);
    }
    Ok(format!("{h:016x}"))
}

/// The first and last 64 KiB of a file.
fn ends(p: &Path, len: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    const N: u64 = 64 << 10;
    let mut f = std::fs::File::open(p)?;
    let mut out = vec![];
    (&mut f).take(N).read_to_end(&mut out)?;
    if len > N {
        f.seek(SeekFrom::Start(len.saturating_sub(N).max(N)))?;
        f.take(N).read_to_end(&mut out)?;
    }
    Ok(out)
}

/// The safetensors name of a dtype.
fn st_dtype(d: Dtype) -> Option<&'static str> {
    Some(match d {
        Dtype::Float32 => "F32",
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        Dtype::Float64 => "F64",
        Dtype::Uint32 => "U32",
        Dtype::Int32 => "I32",
        Dtype::Uint8 => "U8",
        Dtype::Int8 => "I8",
        Dtype::Uint16 => "U16",
        Dtype::Int16 => "I16",
        Dtype::Int64 => "I64",
        Dtype::Uint64 => "U64",
        Dtype::Bool => "BOOL",
        _ => return None,
    })
}

/// An entry found in the directory.
struct DiskEntry {
    tokens: Vec<u32>,
    /// The fewest tokens its state can be trimmed back to (`LayerCaches::trim_floor`).
    trim_floor: usize,
}

/// A file to write, with its bytes already copied off MLX.
struct WriteJob {
    name: String,
    header: Vec<u8>,
    data: Vec<Vec<u8>>,
    /// Entries the new one makes redundant (it extends them): deleted once it is in place.
    supersedes: Vec<String>,
}

/// The directory as one engine sees it: its model's entries, and the writer thread.
pub struct DiskCache {
    dir: PathBuf,
    max_bytes: u64,
    fingerprint: String,
    /// Fresh caches of the model: entries are restored into copies of them.
    template: LayerCaches,
    /// This model's entries by file name.
    index: HashMap<String, DiskEntry>,
    /// Files already found unusable (warned about once).
    bad: HashSet<String>,
    writer: Option<(SyncSender<WriteJob>, std::thread::JoinHandle<()>)>,
}

fn warn(msg: impl std::fmt::Display) {
    eprintln!("mlex: prompt cache on disk: {msg}");
}

impl DiskCache {
    /// The cache in `dir` (created if missing) for the model whose fingerprint is `fingerprint`
    /// and whose fresh caches are `template`.
    pub fn open(dir: &Path, max_bytes: u64, fingerprint: String, template: LayerCaches) -> Result<DiskCache> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(format!("creating the prompt cache directory {}", dir.display()), e))?;
        let (tx, rx) = sync_channel::<WriteJob>(QUEUE);
        let wdir = dir.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("mlex-prompt-disk".into())
            .spawn(move || {
                for job in rx {
                    if let Err(e) = write_entry(&wdir, &job) {
                        warn(format!("writing {}: {e}", wdir.join(&job.name).display()));
                        continue;
                    }
                    for old in &job.supersedes {
                        let _ = std::fs::remove_file(wdir.join(old));
                    }
                    evict(&wdir, max_bytes);
                }
            })
            .map_err(|e| Error::io("spawning the prompt cache writer thread", e))?;
        let mut cache = DiskCache {
            dir: dir.to_path_buf(),
            max_bytes,
            fingerprint,
            template,
            index: HashMap::new(),
            bad: HashSet::new(),
            writer: Some((tx, thread)),
        };
        cache.refresh();
        Ok(cache)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn prefix(&self) -> String {
        format!("pc-{}-", self.fingerprint)
    }

    /// Brings the index up to date with the directory (other processes write and evict too).
    fn refresh(&mut self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        let prefix = self.prefix();
        let mut present = HashSet::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) || !name.ends_with(".safetensors") {
                continue;
            }
            present.insert(name.clone());
            if self.index.contains_key(&name) || self.bad.contains(&name) {
                continue;
            }
            match self.read_header(&self.dir.join(&name)) {
                Ok((entry, _, _)) => {
                    self.index.insert(name, entry);
                }
                Err(e) => {
                    warn(format!("skipping {}: {e}", self.dir.join(&name).display()));
                    self.bad.insert(name);
                }
            }
        }
        self.index.retain(|name, _| present.contains(name));
        self.bad.retain(|name| present.contains(name));
    }

    /// The entry a file holds, the file itself and its layer layout, checked against this model.
    fn read_header(&self, path: &Path) -> Result<(DiskEntry, SafetensorsFile, Vec<Value>)> {
        let file = SafetensorsFile::open(path)?;
        let bad = |msg: String| Error::checkpoint(path, msg);
        let meta = |key: &str| file.metadata.get(key).ok_or_else(|| bad(format!("metadata has no {key:?}: not an mlex prompt cache entry")));
        if meta("format")? != "mlex-prompt-cache" {
            return Err(bad("metadata format is not mlex-prompt-cache".into()));
        }
        if meta("version")? != &FORMAT_VERSION.to_string() {
            return Err(bad(format!("format version {} (this mlex reads {FORMAT_VERSION})", meta("version")?)));
        }
        if meta("fingerprint")? != &self.fingerprint {
            return Err(bad("written for another model".into()));
        }
        let tokens: Vec<u32> = serde_json::from_str(meta("tokens")?).map_err(|e| bad(format!("metadata tokens: {e}")))?;
        let trim_floor: usize = meta("trim_floor")?.parse().map_err(|e| bad(format!("metadata trim_floor: {e}")))?;
        let layers: Vec<Value> = serde_json::from_str(meta("layers")?).map_err(|e| bad(format!("metadata layers: {e}")))?;
        if layers.len() != self.template.len() {
            return Err(bad(format!("{} layers, the model has {}", layers.len(), self.template.len())));
        }
        if tokens.is_empty() || trim_floor > tokens.len() {
            return Err(bad(format!("{} tokens with trim_floor {trim_floor}", tokens.len())));
        }
        Ok((DiskEntry { tokens, trim_floor }, file, layers))
    }

    /// The entry sharing the longest usable prefix with `prompt` (at most `usable` tokens): its
    /// file name and that prefix's length.
    pub fn best(&mut self, prompt: &[u32], usable: usize) -> Option<(String, usize)> {
        self.refresh();
        let mut best: Option<(&String, usize)> = None;
        for (name, e) in &self.index {
            let n = e.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(usable);
            if n < e.trim_floor || n == 0 {
                continue;
            }
            if best.is_none_or(|(_, m)| n > m) {
                best = Some((name, n));
            }
        }
        best.map(|(name, n)| (name.clone(), n))
    }

    /// The tokens and the restored state of the entry `name` (None, with a warning, when the
    /// file went away or is unusable). Its modification time is refreshed (least recently used
    /// goes first).
    pub fn load(&mut self, name: &str) -> Option<(Vec<u32>, LayerCaches)> {
        let path = self.dir.join(name);
        match self.restore(&path) {
            Ok(r) => {
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(r)
            }
            Err(e) => {
                if path.exists() {
                    warn(format!("skipping {}: {e}", path.display()));
                    self.bad.insert(name.to_string());
                }
                self.index.remove(name);
                None
            }
        }
    }

    fn restore(&self, path: &Path) -> Result<(Vec<u32>, LayerCaches)> {
        let (entry, file, layers) = self.read_header(path)?;
        let bad = |msg: String| Error::checkpoint(path, msg);
        let mut saved = Vec::with_capacity(layers.len());
        for (i, l) in layers.iter().enumerate() {
            let kind = l.get("kind").and_then(Value::as_str).ok_or_else(|| bad(format!("layer {i}: no kind")))?;
            let ints = l
                .get("ints")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad(format!("layer {i}: ints must be a list of non-negative integers")))?;
            let names = l.get("arrays").and_then(Value::as_array).ok_or_else(|| bad(format!("layer {i}: no arrays")))?;
            let mut arrays = Vec::with_capacity(names.len());
            for n in names {
                arrays.push(match n.as_str() {
                    None => None,
                    Some(n) => {
                        let info = file.tensors.get(n).ok_or_else(|| bad(format!("layer {i}: tensor {n:?} missing")))?;
                        Some(file.array(info)?)
                    }
                });
            }
            saved.push(SavedCache { kind: kind.to_string(), ints, arrays });
        }
        let mut caches = self.template.clone();
        caches.restore(saved).map_err(|e| bad(e.to_string()))?;
        if caches.offset() != entry.tokens.len() {
            return Err(bad(format!("the state holds {} tokens, the metadata lists {}", caches.offset(), entry.tokens.len())));
        }
        Ok((entry.tokens, caches))
    }

    /// Queues `caches` (holding exactly `tokens`) for writing, unless an entry on disk already
    /// covers it or the writer is busy. The arrays are copied off MLX here (the engine thread);
    /// the file is written by the writer thread.
    pub fn save(&mut self, tokens: &[u32], caches: &LayerCaches) -> Result<()> {
        if self.writer.is_none() {
            return Ok(());
        }
        if caches.offset() != tokens.len() || tokens.is_empty() {
            return Ok(());
        }
        // Ids standing for images are this session's own (their slots are given in the order
        // images arrive): another process would read them as other images.
        if tokens.iter().any(|&t| crate::models::vision_lm::is_media_token(t)) {
            return Ok(());
        }
        let Some(saved) = caches.save()? else { return Ok(()) };
        self.refresh();
        let trim_floor = caches.trim_floor();
        // Already on disk (this state or one that extends it and can be taken back to it).
        if let Some((name, _)) = self.index.iter().find(|(_, e)| e.tokens.starts_with(tokens) && e.trim_floor <= tokens.len()) {
            if let Ok(f) = std::fs::File::options().write(true).open(self.dir.join(name)) {
                let _ = f.set_modified(SystemTime::now());
            }
            return Ok(());
        }
        let supersedes: Vec<String> = self
            .index
            .iter()
            .filter(|(_, e)| tokens.starts_with(&e.tokens) && trim_floor <= e.tokens.len())
            .map(|(n, _)| n.clone())
            .collect();
        let mut header = serde_json::Map::new();
        let mut data = vec![];
        let mut offset = 0usize;
        let mut layers = vec![];
        for (i, s) in saved.iter().enumerate() {
            let mut names = vec![];
            for (j, a) in s.arrays.iter().enumerate() {
                let Some(a) = a else {
                    names.push(Value::Null);
                    continue;
                };
                let name = format!("layers.{i}.{j}");
                let Some(dt) = st_dtype(a.dtype()) else { return Ok(()) };
                let bytes = a.to_bytes()?;
                header.insert(name.clone(), json!({"dtype": dt, "shape": a.shape(), "data_offsets": [offset, offset + bytes.len()]}));
                offset += bytes.len();
                data.push(bytes);
                names.push(Value::String(name));
            }
            layers.push(json!({"kind": s.kind, "ints": s.ints, "arrays": names}));
        }
        if offset as u64 > self.max_bytes {
            return Ok(());
        }
        let tokens_json = serde_json::to_string(tokens).unwrap_or_default();
        header.insert(
            "__metadata__".into(),
            json!({
                "format": "mlex-prompt-cache",
                "version": FORMAT_VERSION.to_string(),
                "fingerprint": self.fingerprint,
                "tokens": tokens_json,
                "trim_floor": trim_floor.to_string(),
                "layers": Value::Array(layers).to_string(),
            }),
        );
        let mut header = serde_json::to_vec(&header).map_err(|e| Error::Mlx(format!("prompt cache header: {e}")))?;
        while header.len() % 8 != 0 {
            header.push(b' ');
        }
        let mut h = FNV_START;
        fnv1a(&mut h, tokens_json.as_bytes());
        let name = format!("{}{h:016x}.safetensors", self.prefix());
        let Some((tx, _)) = &self.writer else { return Ok(()) };
        match tx.try_send(WriteJob { name, header, data, supersedes }) {
            Ok(()) | Err(TrySendError::Full(_)) => Ok(()),
            Err(TrySendError::Disconnected(_)) => {
                self.writer = None;
                Ok(())
            }
        }
    }
}

impl Drop for DiskCache {
    /// Writes still queued finish first (a CLI run's entry must be there for the next process).
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.writer.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

/// Writes `job` under a temporary name, then renames it into place (atomic on one filesystem).
fn write_entry(dir: &Path, job: &WriteJob) -> std::io::Result<()> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-pc-{}-{n}", std::process::id()));
    let res = (|| {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        f.write_all(&(job.header.len() as u64).to_le_bytes())?;
        f.write_all(&job.header)?;
        for d in &job.data {
            f.write_all(d)?;
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_data()?;
        std::fs::rename(&tmp, dir.join(&job.name))
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

/// Deletes the least recently used entries (any model's) until the directory's entries fit
/// `max_bytes`, and temporary files left by writers that died. Files that are not entries are
/// left alone. Another process deleting the same file at the same time is harmless.
pub fn evict(dir: &Path, max_bytes: u64) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    let now = SystemTime::now();
    let mut entries = vec![];
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(meta) = e.metadata() else { continue };
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if name.starts_with(".tmp-pc-") {
            if now.duration_since(mtime).unwrap_or_default() > STALE_TMP {
                let _ = std::fs::remove_file(e.path());
            }
        } else if name.starts_with("pc-") && name.ends_with(".safetensors") && meta.is_file() {
            entries.push((mtime, meta.len(), e.path()));
        }
    }
    let mut total: u64 = entries.iter().map(|e| e.1).sum();
    entries.sort_by_key(|e| e.0);
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        let _ = std::fs::remove_file(&path);
        total -= len;
    }
}

/// Bytes of the prompt cache entries in `dir` (any model's).
pub fn dir_bytes(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("pc-") && n.ends_with(".safetensors")
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}
