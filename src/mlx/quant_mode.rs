//! MLX's quantization modes and which (bits, group size) pairs each implements: plain Rust, apart
//! from quant.rs's FFI, so config parsing (loader/quant_config.rs) builds without MLX (the fuzz
//! crate compiles it on its own).

/// MLX quantization modes. Only the mode string crosses into MLX, so every mode it knows works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantMode {
    /// scale·q + bias per group (mlx-lm's default).
    Affine,
    Mxfp4,
    Mxfp8,
    Nvfp4,
}

impl QuantMode {
    pub fn as_str(self) -> &'static str {
        match self {
            QuantMode::Affine => "affine",
            QuantMode::Mxfp4 => "mxfp4",
            QuantMode::Mxfp8 => "mxfp8",
            QuantMode::Nvfp4 => "nvfp4",
        }
    }

    pub fn parse(s: &str) -> Option<QuantMode> {
        match s {
            "affine" => Some(QuantMode::Affine),
            "mxfp4" => Some(QuantMode::Mxfp4),
            "mxfp8" => Some(QuantMode::Mxfp8),
            "nvfp4" => Some(QuantMode::Nvfp4),
            _ => None,
        }
    }

    /// Whether the mode stores a per-group bias next to the scales.
    pub fn has_biases(self) -> bool {
        matches!(self, QuantMode::Affine)
    }

    /// Checks a (bits, group size) pair against what MLX 0.32 implements for this mode.
    pub fn validate(self, bits: u32, group_size: u32) -> std::result::Result<(), String> {
        let ok = match self {
            QuantMode::Affine => matches!(bits, 2 | 3 | 4 | 5 | 6 | 8) && matches!(group_size, 32 | 64 | 128),
            QuantMode::Mxfp4 => bits == 4 && group_size == 32,
            QuantMode::Mxfp8 => bits == 8 && group_size == 32,
            QuantMode::Nvfp4 => bits == 4 && group_size == 16,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "unsupported quantization: mode {} with bits {bits} and group_size {group_size} \
                 (affine: bits 2/3/4/5/6/8, groups 32/64/128; mxfp4: 4/32; mxfp8: 8/32; nvfp4: 4/16)",
                self.as_str()
            ))
        }
    }
}
