//! A minimal GGUF v3 writer, enough to build test fixtures (tiny synthetic models) in test code.
//! Tensor data is given as raw bytes already in the ggml block layout of its type.
use super::{GgmlType, Value, ValueType, GGUF_MAGIC};

/// Builds a GGUF image in memory.
#[derive(Default)]
pub struct GgufWriter {
    pub metadata: Vec<(String, Value)>,
    /// name, ggml dims (innermost first), type, raw data
    pub tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    pub alignment: u64,
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { alignment: 32, ..Default::default() }
    }

    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    pub fn str(&mut self, key: &str, v: &str) -> &mut Self {
        self.kv(key, Value::String(v.to_string()))
    }

    pub fn u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv(key, Value::U32(v))
    }

    pub fn f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.kv(key, Value::F32(v))
    }

    pub fn strs(&mut self, key: &str, v: &[&str]) -> &mut Self {
        self.kv(key, Value::Array(ValueType::String, v.iter().map(|s| Value::String(s.to_string())).collect()))
    }

    /// Add a tensor with a row-major `shape` (outermost first); stored reversed as ggml dims.
    pub fn tensor(&mut self, name: &str, shape: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        let dims = shape.iter().rev().copied().collect();
        self.tensors.push((name.to_string(), dims, ty, data));
        self
    }

    /// Add an f32 tensor from values.
    pub fn tensor_f32(&mut self, name: &str, shape: &[u64], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, shape, GgmlType::F32, data)
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => Self::put_str(out, s),
            Value::Array(t, items) => {
                out.extend_from_slice(&(*t as u32).to_le_bytes());
                out.extend_from_slice(&(items.len() as u64).to_le_bytes());
                for i in items {
                    Self::put_value(out, i);
                }
            }
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
    }

    /// Serialize to bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let a = self.alignment.max(1) as usize;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            Self::put_str(&mut out, k);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            Self::put_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::new();
        for (name, dims, ty, data) in &self.tensors {
            Self::put_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len()).div_ceil(a) * a;
        }
        out.resize(out.len().div_ceil(a) * a, 0);
        let base = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(base + off, 0);
            out.extend_from_slice(data);
        }
        out
    }
}
