//! A strict reader for `.safetensors` files over a copy-on-write memory map.
//!
//! Every header field is checked against the file before any byte is handed to MLX: a truncated
//! file, an offset past the end, a size that does not match dtype × shape, or an unknown dtype is
//! an error naming the file and the tensor.
use super::safetensors_header::{parse_header, Header};
use crate::error::{Error, Result};
use crate::mlx::Array;
use memmap2::MmapMut;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use super::safetensors_header::TensorInfo;

/// An opened, validated safetensors file.
pub struct SafetensorsFile {
    pub path: PathBuf,
    map: Arc<MmapMut>,
    pub tensors: BTreeMap<String, TensorInfo>,
    pub metadata: BTreeMap<String, String>,
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        // Private, writable (copy-on-write) map: MLX may reuse an input buffer in place for an op's
        // output, and a read-only map would turn that into a segfault. Pages stay shared with the
        // page cache until written.
        let map = unsafe { memmap2::MmapOptions::new().map_copy(&file) }
            .map_err(|e| Error::io(format!("mapping {}", path.display()), e))?;
        let Header { tensors, metadata } = parse_header(&map, path)?;
        Ok(SafetensorsFile { path: path.to_path_buf(), map: Arc::new(map), tensors, metadata })
    }

    /// The raw bytes of one tensor.
    pub fn bytes(&self, info: &TensorInfo) -> &[u8] {
        &self.map[info.start..info.end]
    }

    /// The tensor as an MLX array that reads straight from the map where alignment allows it.
    pub fn array(&self, info: &TensorInfo) -> Result<Array> {
        let bytes = self.bytes(info);
        let shape: Vec<i32> = info.shape.iter().map(|&d| d as i32).collect();
        if (bytes.as_ptr() as usize) % info.dtype.size() == 0 {
            Array::from_owned_bytes(bytes, &shape, info.dtype, Box::new(self.map.clone()))
        } else {
            // Misaligned data (legal in the format): copy into an MLX-owned buffer.
            let arr = Array::from_slice(bytes, &[bytes.len() as i32])?;
            arr.view_as(info.dtype, &shape)
        }
    }
}
