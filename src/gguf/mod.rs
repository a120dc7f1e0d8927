//! A strict GGUF (v2/v3) reader over a memory map.
//!
//! Layout (all little-endian): magic `GGUF`, `u32` version, `u64` tensor count, `u64` metadata
//! count, the metadata key/value pairs, the tensor infos (name, dims innermost first, ggml type,
//! offset relative to the data section), padding to `general.alignment` (default 32), the data.
//!
//! Every read is bounds-checked: a malformed file gives [`Error::InvalidCheckpoint`] naming the
//! file and the key or tensor at fault, never a panic and never an allocation sized by an
//! unchecked count.
pub mod quants;
pub mod types;
pub mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
pub use types::GgmlType;

/// `GGUF` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most this many dimensions.
pub const MAX_DIMS: usize = 4;

/// A metadata value type id (`gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Smallest encoded size of one value of this type (used to reject absurd array counts).
    fn min_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// Element type and elements (all of that type).
    Array(ValueType, Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(..) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type as i128 (bools are not integers here).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// Any numeric type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(_, v) => Some(v),
            _ => None,
        }
    }
}

/// One tensor's info.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (contiguous) one, i.e. the reverse of
    /// the row-major shape. A 2-D weight `[out, in]` is stored as `dims = [in, out]`.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Row-major shape (outermost first), as safetensors / MLX / numpy use it.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    /// Elements in one row (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of the outer dims).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes in one row.
    pub fn row_bytes(&self) -> u64 {
        self.row_len() / self.ty.block_size() as u64 * self.ty.type_size() as u64
    }
}

enum Backing {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An opened GGUF file.
pub struct GgufFile {
    path: PathBuf,
    data: Backing,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: impl Into<String>) -> Error {
        Error::checkpoint(self.path, msg.into())
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "truncated file: {} needs {n} bytes at offset {}, only {} left",
                what(),
                self.pos,
                self.remaining()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }

    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(self.err(format!(
                "{}: string length {len} runs past the end of the file ({} bytes left)",
                what(),
                self.remaining()
            )));
        }
        self.take(len, what)
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: u32) -> Result<Value> {
        let what = || format!("metadata key '{key}'");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.u8(&what)?),
            ValueType::I8 => Value::I8(self.u8(&what)? as i8),
            ValueType::U16 => Value::U16(self.u16(&what)?),
            ValueType::I16 => Value::I16(self.u16(&what)? as i16),
            ValueType::U32 => Value::U32(self.u32(&what)?),
            ValueType::I32 => Value::I32(self.u32(&what)? as i32),
            ValueType::F32 => Value::F32(f32::from_bits(self.u32(&what)?)),
            ValueType::U64 => Value::U64(self.u64(&what)?),
            ValueType::I64 => Value::I64(self.u64(&what)? as i64),
            ValueType::F64 => Value::F64(f64::from_bits(self.u64(&what)?)),
            ValueType::Bool => match self.u8(&what)? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(format!("metadata key '{key}': invalid bool byte {b}"))),
            },
            ValueType::String => {
                let b = self.string_bytes(&what)?;
                // Token strings of some vocabularies are not valid UTF-8; keep them readable
                // rather than failing the whole file.
                Value::String(String::from_utf8_lossy(b).into_owned())
            }
            ValueType::Array => {
                // Nested arrays are legal in the format; cap the depth so a hostile file cannot
                // recurse without bound.
                if depth > 8 {
                    return Err(self.err(format!("metadata key '{key}': arrays nested too deep")));
                }
                let ety_id = self.u32(&what)?;
                let ety = ValueType::from_id(ety_id).ok_or_else(|| {
                    self.err(format!("metadata key '{key}': unknown array element type {ety_id}"))
                })?;
                let count = self.u64(&what)?;
                let need = count.checked_mul(ety.min_size()).unwrap_or(u64::MAX);
                if need > self.remaining() {
                    return Err(self.err(format!(
                        "metadata key '{key}': array of {count} elements cannot fit in the {} bytes left",
                        self.remaining()
                    )));
                }
                // Grow as elements actually parse: a count that fits the bytes left can still be far more
                // Values (32 bytes each) than bytes.
                let mut items = Vec::with_capacity(count.min(1 << 16) as usize);
                for _ in 0..count {
                    items.push(self.value(ety, key, depth + 1)?);
                }
                Value::Array(ety, items)
            }
        })
    }
}

fn align_up(x: u64, a: u64) -> Option<u64> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

impl GgufFile {
    /// Memory-map and parse a GGUF file.
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("reading metadata of {}", path.display()), e))?
            .len();
        if len < 24 {
            return Err(Error::checkpoint(
                path,
                format!("truncated file: {len} bytes is shorter than a GGUF header"),
            ));
        }
        // SAFETY: the map is read-only; like every mmap-based loader we assume the file is not
        // truncated by someone else while it is open.
        let mmap = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| Error::io(format!("memory-mapping {}", path.display()), e))?;
        Self::parse(path.to_path_buf(), Backing::Mmap(mmap))
    }

    /// Parse a GGUF image held in memory; `path` only names it in errors.
    pub fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Self> {
        Self::parse(path.into(), Backing::Owned(bytes))
    }

    fn parse(path: PathBuf, data: Backing) -> Result<Self> {
        let buf = data.bytes();
        let mut c = Cursor { buf, pos: 0, path: &path };
        let hdr = || "header".to_string();
        let magic = c.u32(&hdr)?;
        if magic != GGUF_MAGIC {
            return Err(c.err(format!(
                "not a GGUF file: bad magic {:02x?} (expected \"GGUF\")",
                magic.to_le_bytes()
            )));
        }
        let version = c.u32(&hdr)?;
        match version {
            2 | 3 => {}
            1 => return Err(c.err("GGUF version 1 is not supported (re-convert with a newer llama.cpp)")),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(c.err("big-endian GGUF files are not supported"))
            }
            v => return Err(c.err(format!("unsupported GGUF version {v}"))),
        }
        let n_tensors = c.u64(&hdr)?;
        let n_kv = c.u64(&hdr)?;
        // A key/value pair needs at least 8 (key len) + 4 (type) + 1 bytes; a tensor info at
        // least 8 + 4 + 8 + 4 + 8.
        if n_kv.checked_mul(13).is_none_or(|n| n > c.remaining()) {
            return Err(c.err(format!("absurd metadata count {n_kv} for a file of {} bytes", buf.len())));
        }
        if n_tensors.checked_mul(32).is_none_or(|n| n > c.remaining()) {
            return Err(c.err(format!("absurd tensor count {n_tensors} for a file of {} bytes", buf.len())));
        }

        let mut metadata = Vec::with_capacity(n_kv.min(1 << 12) as usize);
        let mut index = HashMap::with_capacity(n_kv.min(1 << 12) as usize);
        for i in 0..n_kv {
            let what = || format!("key of metadata entry {i}");
            let kb = c.string_bytes(&what)?;
            let key = std::str::from_utf8(kb)
                .map_err(|_| c.err(format!("metadata entry {i}: key is not valid UTF-8")))?
                .to_string();
            let what = || format!("type of metadata key '{key}'");
            let tid = c.u32(&what)?;
            let ty = ValueType::from_id(tid)
                .ok_or_else(|| c.err(format!("metadata key '{key}': unknown value type {tid}")))?;
            let v = c.value(ty, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(c.err(format!("duplicate metadata key '{key}'")));
            }
            metadata.push((key, v));
        }

        let alignment = match metadata.get(index.get("general.alignment").copied().unwrap_or(usize::MAX)) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => {
                let a = v.as_int().ok_or_else(|| {
                    c.err(format!("metadata key 'general.alignment' has type {:?}, expected an integer", v.value_type()))
                })?;
                if a <= 0 || a > (1 << 30) || (a & (a - 1)) != 0 {
                    return Err(c.err(format!("metadata key 'general.alignment' = {a} is not a power of two")));
                }
                a as u64
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors.min(1 << 14) as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors.min(1 << 14) as usize);
        for i in 0..n_tensors {
            let what = || format!("name of tensor info {i}");
            let nb = c.string_bytes(&what)?;
            let name = std::str::from_utf8(nb)
                .map_err(|_| c.err(format!("tensor info {i}: name is not valid UTF-8")))?
                .to_string();
            let what = || format!("tensor '{name}'");
            let n_dims = c.u32(&what)?;
            if n_dims as usize > MAX_DIMS {
                return Err(c.err(format!("tensor '{name}': {n_dims} dimensions (at most {MAX_DIMS})")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64(&what)?);
            }
            let tid = c.u32(&what)?;
            let ty = GgmlType::from_id(tid)
                .ok_or_else(|| c.err(format!("tensor '{name}': unknown ggml type {tid}")))?;
            let offset = c.u64(&what)?;
            // The product of the non-zero dims is bounded too: a zero dim makes the tensor empty,
            // but the others still size its rows (`n_rows`, `row_bytes`).
            let nonzero = dims.iter().filter(|&&d| d != 0).try_fold(1u64, |n, &d| {
                n.checked_mul(d).filter(|&n| n < (1u64 << 60))
            });
            let n_elements = match nonzero {
                None => return Err(c.err(format!("tensor '{name}': dimensions {dims:?} overflow"))),
                Some(_) if dims.contains(&0) => 0,
                Some(n) => n,
            };
            let row = dims.first().copied().unwrap_or(1);
            let bs = ty.block_size() as u64;
            if row % bs != 0 {
                return Err(c.err(format!(
                    "tensor '{name}': row length {row} is not a multiple of the {ty} block size {bs}"
                )));
            }
            let n_bytes = n_elements / bs * ty.type_size() as u64;
            if offset % alignment != 0 {
                return Err(c.err(format!(
                    "tensor '{name}': data offset {offset} is not aligned to {alignment}"
                )));
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(c.err(format!("duplicate tensor name '{name}'")));
            }
            tensors.push(TensorInfo { name, dims, ty, offset, n_elements, n_bytes });
        }

        let data_offset = align_up(c.pos as u64, alignment)
            .ok_or_else(|| c.err("data section offset overflows"))?;
        let file_len = buf.len() as u64;
        if data_offset > file_len && !tensors.is_empty() {
            return Err(c.err(format!(
                "truncated file: data section starts at {data_offset}, file has {file_len} bytes"
            )));
        }
        let data_len = file_len.saturating_sub(data_offset);
        for t in &tensors {
            let end = t.offset.checked_add(t.n_bytes).unwrap_or(u64::MAX);
            if end > data_len {
                return Err(c.err(format!(
                    "tensor '{}': data [{}, {end}) runs past the end of the data section ({data_len} bytes){}",
                    t.name,
                    t.offset,
                    if t.offset >= data_len { " (offset past end / truncated file)" } else { " (truncated file)" }
                )));
            }
        }

        Ok(GgufFile {
            path,
            data,
            version,
            metadata,
            index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An error about this file.
    pub fn err(&self, msg: impl Into<String>) -> Error {
        Error::checkpoint(&self.path, msg.into())
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A string value; `Ok(None)` when absent, an error when present with another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.type_err(key, v, "a string")),
        }
    }

    /// An unsigned integer value of any integer type.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int() {
                Some(i) if (0..=u64::MAX as i128).contains(&i) => Ok(Some(i as u64)),
                Some(i) => Err(self.err(format!("metadata key '{key}' = {i} is out of range"))),
                None => Err(self.type_err(key, v, "an integer")),
            },
        }
    }

    /// A numeric value (int or float) as f64.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.type_err(key, v, "a number")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.type_err(key, v, "a bool")),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| self.type_err(key, v, "an array")),
        }
    }

    fn type_err(&self, key: &str, v: &Value, want: &str) -> Error {
        self.err(format!("metadata key '{key}' has type {:?}, expected {want}", v.value_type()))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (bounds were checked at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.data.bytes()[start..start + t.n_bytes as usize]
    }

    /// Dequantize rows `[row]` of a tensor into `out` (length `row_len`).
    pub fn dequantize_row(&self, t: &TensorInfo, row: u64, out: &mut [f32]) -> Result<()> {
        // An empty tensor (a zero dim) has no rows.
        if row >= t.n_rows() {
            return Err(self.err(format!("tensor '{}': row {row} out of range", t.name)));
        }
        let rb = t.row_bytes() as usize;
        let data = self.tensor_data(t);
        let bytes = &data[row as usize * rb..(row as usize + 1) * rb];
        quants::dequantize_row(t.ty, bytes, out)
            .map_err(|m| self.err(format!("tensor '{}': {m}", t.name)))
    }

    /// Dequantize a whole tensor to f32 (row-major, same element order as the file).
    pub fn dequantize(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let mut out = vec![0f32; t.n_elements as usize];
        quants::dequantize_row(t.ty, self.tensor_data(t), &mut out)
            .map_err(|m| self.err(format!("tensor '{}': {m}", t.name)))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::writer::GgufWriter;
    use super::*;

    // Found by fuzz/fuzz_targets/gguf.rs (corpus/gguf/regress-empty-tensor-row): row 0 of a tensor
    // with a zero dim was read past the end of its (empty) data.
    #[test]
    fn empty_tensor_has_no_rows() {
        let mut w = GgufWriter::new();
        w.tensor("empty", &[0, 256], GgmlType::Q4_K, vec![]);
        let f = GgufFile::from_bytes("t.gguf", w.to_bytes()).unwrap();
        let t = f.tensor("empty").unwrap();
        assert_eq!((t.n_elements, t.n_bytes, t.n_rows()), (0, 0, 0));
        let mut row = vec![0f32; 256];
        let e = f.dequantize_row(t, 0, &mut row).unwrap_err();
        assert!(e.to_string().contains("row 0 out of range"), "{e}");
        assert!(f.dequantize(t).unwrap().is_empty());
    }

    // The element count of a tensor with a zero dim is 0, but its row count must not overflow.
    #[test]
    fn zero_dim_does_not_hide_overflowing_dims() {
        let mut w = GgufWriter::new();
        w.tensor("huge", &[1 << 40, 1 << 40, 0], GgmlType::F32, vec![]);
        let e = GgufFile::from_bytes("t.gguf", w.to_bytes()).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{e}");
    }
}
