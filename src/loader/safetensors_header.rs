//! The pure part of reading a checkpoint: a `.safetensors` header (every field checked against the
//! file's length) and the shard list of `model.safetensors.index.json`. Plain Rust over bytes and
//! text, apart from the memory map and MLX arrays of safetensors.rs / weights.rs, so the fuzz crate
//! compiles it on its own (fuzz/fuzz_targets/safetensors_header.rs).
use crate::error::{Error, Result};
use crate::mlx::Dtype;
use std::collections::BTreeMap;
use std::path::Path;

/// Headers above this size are treated as corrupt rather than parsed.
const MAX_HEADER_BYTES: u64 = 100 << 20;

/// One tensor's entry in a safetensors header.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range within the file (absolute).
    pub start: usize,
    pub end: usize,
}

/// A validated header: every tensor's byte range lies inside the file and matches dtype × shape.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub tensors: BTreeMap<String, TensorInfo>,
    pub metadata: BTreeMap<String, String>,
}

fn parse_dtype(s: &str) -> Option<Dtype> {
    Some(match s {
        "F32" => Dtype::Float32,
        "F16" => Dtype::Float16,
        "BF16" => Dtype::Bfloat16,
        "F64" => Dtype::Float64,
        "U32" => Dtype::Uint32,
        "I32" => Dtype::Int32,
        "U8" => Dtype::Uint8,
        "I8" => Dtype::Int8,
        "U16" => Dtype::Uint16,
        "I16" => Dtype::Int16,
        "I64" => Dtype::Int64,
        "U64" => Dtype::Uint64,
        "BOOL" => Dtype::Bool,
        _ => return None,
    })
}

/// Parses and validates the header of a whole safetensors file held in `file` (the map); `path`
/// only names it in errors.
pub fn parse_header(file: &[u8], path: &Path) -> Result<Header> {
    let err = |msg: String| Error::checkpoint(path, msg);
    let len = file.len() as u64;
    if len < 8 {
        return Err(err(format!("file is {len} bytes, too short for a safetensors header")));
    }
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap());
    if header_len > MAX_HEADER_BYTES || 8 + header_len > len {
        return Err(err(format!(
            "header length {header_len} runs past the end of the file ({len} bytes): truncated or not safetensors"
        )));
    }
    let header_end = 8 + header_len as usize;
    let header: serde_json::Value = serde_json::from_slice(&file[8..header_end])
        .map_err(|e| err(format!("header is not valid JSON: {e}")))?;
    let obj = header.as_object().ok_or_else(|| err("header is not a JSON object".into()))?;
    let data_len = file.len() - header_end;
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for (name, entry) in obj {
        if name == "__metadata__" {
            if let Some(m) = entry.as_object() {
                for (k, v) in m {
                    metadata.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                }
            }
            continue;
        }
        let terr = |msg: &str| err(format!("tensor '{name}': {msg}"));
        let dtype_s = entry.get("dtype").and_then(|d| d.as_str()).ok_or_else(|| terr("missing dtype"))?;
        let dtype = parse_dtype(dtype_s).ok_or_else(|| terr(&format!("unsupported dtype {dtype_s}")))?;
        let shape: Vec<usize> = entry
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| terr("missing shape"))?
            .iter()
            .map(|d| d.as_u64().filter(|&d| d <= i32::MAX as u64).map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| terr("shape must be a list of non-negative integers"))?;
        let offs = entry
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| terr("missing data_offsets [begin, end]"))?;
        let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b as usize, e as usize),
            _ => return Err(terr("data_offsets must be [begin, end] with begin <= end")),
        };
        if e > data_len {
            return Err(terr(&format!(
                "data_offsets [{b}, {e}] run past the end of the data ({data_len} bytes): truncated file"
            )));
        }
        let elems = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let expected = elems.and_then(|n| n.checked_mul(dtype.size()));
        if expected != Some(e - b) {
            return Err(terr(&format!(
                "{} bytes stored for a {dtype_s} tensor of shape {shape:?} (needs {})",
                e - b,
                expected.map_or("too many".to_string(), |n| n.to_string())
            )));
        }
        tensors.insert(
            name.clone(),
            TensorInfo { name: name.clone(), dtype, shape, start: header_end + b, end: header_end + e },
        );
    }
    Ok(Header { tensors, metadata })
}

/// The shard file names `model.safetensors.index.json` (`text`, read from `index`) lists in its
/// `weight_map`, sorted and without repeats.
pub fn index_shards(text: &str, index: &Path) -> Result<Vec<String>> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::checkpoint(index, format!("not valid JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| Error::checkpoint(index, "missing field 'weight_map'"))?;
    let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
    files.sort();
    files.dedup();
    Ok(files)
}
