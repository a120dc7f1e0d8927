//! A streaming safetensors writer: the header (names, dtypes, shapes, offsets) is fixed up front,
//! then tensor bytes are streamed in header order, so no tensor needs to be held whole in memory.
//!
//! Format: u64 LE header length, JSON header (padded with spaces to a multiple of 8), data.
//! Offsets are relative to the data start, ascending, contiguous.
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Element types we write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    U32,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 | Dtype::U32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "F32",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::U32 => "U32",
        }
    }

    /// Append f32 values converted to this float dtype (round to nearest even).
    pub fn extend_from_f32(self, out: &mut Vec<u8>, vals: &[f32]) {
        match self {
            Dtype::F32 => vals.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            Dtype::F16 => vals
                .iter()
                .for_each(|v| out.extend_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes())),
            Dtype::BF16 => vals
                .iter()
                .for_each(|v| out.extend_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes())),
            Dtype::U32 => panic!("extend_from_f32 on U32"),
        }
    }
}

/// One planned tensor.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
}

impl Entry {
    pub fn n_bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size()
    }
}

/// Writes entries in order; each `write` call appends to the current tensor.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    entries: Vec<Entry>,
    current: usize,
    written_in_current: u64,
    pub total_bytes: u64,
}

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("writing {}", path.display()), e)
}

impl SafetensorsWriter {
    /// Create the file and write the header. `metadata` goes under `__metadata__`.
    pub fn create(path: &Path, entries: Vec<Entry>, metadata: &[(&str, &str)]) -> Result<Self> {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            let m: serde_json::Map<String, serde_json::Value> =
                metadata.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect();
            header.insert("__metadata__".into(), m.into());
        }
        let mut offset = 0u64;
        for e in &entries {
            let n = e.n_bytes();
            if header.contains_key(&e.name) {
                return Err(Error::InvalidArgument(format!("duplicate tensor name {} in output", e.name)));
            }
            header.insert(
                e.name.clone(),
                serde_json::json!({"dtype": e.dtype.name(), "shape": e.shape, "data_offsets": [offset, offset + n]}),
            );
            offset += n;
        }
        let mut h = serde_json::to_vec(&header).expect("json");
        while h.len() % 8 != 0 {
            h.push(b' ');
        }
        let file = File::create(path).map_err(|e| io_err(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(h.len() as u64).to_le_bytes()).map_err(|e| io_err(path, e))?;
        out.write_all(&h).map_err(|e| io_err(path, e))?;
        let total_bytes = 8 + h.len() as u64 + offset;
        let mut w = SafetensorsWriter {
            path: path.to_path_buf(),
            out,
            entries,
            current: 0,
            written_in_current: 0,
            total_bytes,
        };
        w.skip_empty();
        Ok(w)
    }

    fn skip_empty(&mut self) {
        while self.current < self.entries.len() && self.written_in_current == self.entries[self.current].n_bytes() {
            self.current += 1;
            self.written_in_current = 0;
        }
    }

    /// The name of the tensor the next bytes belong to.
    pub fn current_name(&self) -> Option<&str> {
        self.entries.get(self.current).map(|e| e.name.as_str())
    }

    /// Append bytes to tensor `name`, which must be the current one; bytes may not run past it.
    pub fn write(&mut self, name: &str, bytes: &[u8]) -> Result<()> {
        let Some(e) = self.entries.get(self.current) else {
            return Err(Error::InvalidArgument(format!("safetensors writer: {name} written after the last tensor")));
        };
        if e.name != name {
            return Err(Error::InvalidArgument(format!(
                "safetensors writer: got bytes for {name} while {} is incomplete",
                e.name
            )));
        }
        if self.written_in_current + bytes.len() as u64 > e.n_bytes() {
            return Err(Error::InvalidArgument(format!("safetensors writer: too many bytes for {name}")));
        }
        self.out.write_all(bytes).map_err(|err| io_err(&self.path, err))?;
        self.written_in_current += bytes.len() as u64;
        self.skip_empty();
        Ok(())
    }

    /// Flush and check that every tensor was written completely.
    pub fn finish(mut self) -> Result<u64> {
        if let Some(e) = self.entries.get(self.current) {
            return Err(Error::InvalidArgument(format!(
                "safetensors writer: tensor {} incomplete ({} of {} bytes)",
                e.name,
                self.written_in_current,
                e.n_bytes()
            )));
        }
        self.out.flush().map_err(|e| io_err(&self.path, e))?;
        let file = self.out.into_inner().map_err(|e| io_err(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| io_err(&self.path, e))?;
        Ok(self.total_bytes)
    }
}
