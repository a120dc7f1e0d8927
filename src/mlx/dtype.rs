//! MLX element types.
use super::sys;

/// An MLX dtype (same order as `mlx::core::Dtype::Val`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Float16,
    Float32,
    Float64,
    Bfloat16,
    Complex64,
}

impl Dtype {
    pub(crate) fn to_sys(self) -> sys::mlex_dtype {
        self as sys::mlex_dtype
    }

    pub(crate) fn from_sys(v: sys::mlex_dtype) -> Dtype {
        use Dtype::*;
        const ALL: [Dtype; 14] = [
            Bool, Uint8, Uint16, Uint32, Uint64, Int8, Int16, Int32, Int64, Float16, Float32, Float64, Bfloat16,
            Complex64,
        ];
        ALL[v as usize]
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            Bool | Uint8 | Int8 => 1,
            Uint16 | Int16 | Float16 | Bfloat16 => 2,
            Uint32 | Int32 | Float32 => 4,
            Uint64 | Int64 | Float64 | Complex64 => 8,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Float16 | Dtype::Float32 | Dtype::Float64 | Dtype::Bfloat16)
    }

    /// The name mlx-lm / numpy use ("float32", "bfloat16", …).
    pub fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            Bool => "bool",
            Uint8 => "uint8",
            Uint16 => "uint16",
            Uint32 => "uint32",
            Uint64 => "uint64",
            Int8 => "int8",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            Float16 => "float16",
            Float32 => "float32",
            Float64 => "float64",
            Bfloat16 => "bfloat16",
            Complex64 => "complex64",
        }
    }

    /// Parses "float32"/"f32", "bfloat16"/"bf16", "float16"/"f16".
    pub fn parse_float(s: &str) -> Option<Dtype> {
        match s.to_ascii_lowercase().as_str() {
            "float32" | "f32" | "fp32" => Some(Dtype::Float32),
            "bfloat16" | "bf16" => Some(Dtype::Bfloat16),
            "float16" | "f16" | "fp16" | "half" => Some(Dtype::Float16),
            _ => None,
        }
    }
}

/// Rust element types that map to an MLX dtype (for copies in and out).
pub trait Element: Copy + Default + 'static {
    const DTYPE: Dtype;
}
macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}
element!(bool => Bool, u8 => Uint8, u16 => Uint16, u32 => Uint32, u64 => Uint64, i8 => Int8, i16 => Int16,
         i32 => Int32, i64 => Int64, f32 => Float32, f64 => Float64, half::f16 => Float16, half::bf16 => Bfloat16);
