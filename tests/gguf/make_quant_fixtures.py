#!/usr/bin/env python3
"""Reference fixtures for mlex's GGUF block decoders.

Writes a small GGUF file holding, for every block type, random raw blocks (tensor `<TYPE>.q`)
and the `gguf` package's own dequantization of them (tensor `<TYPE>.f32`, F32).
The Rust test `gguf_quants_match_reference` reads it with our reader and compares bit for bit.

Usage: python make_quant_fixtures.py OUT.gguf [SEED]
Needs: pip install gguf numpy
"""
import sys

import numpy as np
import gguf
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "F16", "BF16"]

# Byte offsets of the f16 scale fields inside each block, so that random bytes are replaced by
# finite, modest scales (random bit patterns would give NaN/Inf and huge values).
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}


def main():
    out = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1234
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(out, "mlex-quant-fixtures")
    for name in TYPES:
        qt = T[name]
        block, size = GGML_QUANT_SIZES[qt]
        n_blocks = 2 if block == 256 else (4 if block == 32 else 64)
        if name in ("F16", "BF16"):
            vals = rng.standard_normal(n_blocks).astype(np.float32) * 3
            raw = vals.astype(np.float16).view(np.uint8) if name == "F16" else gguf.quants.quantize(vals, qt)
            raw = np.ascontiguousarray(raw).reshape(1, -1)
        else:
            raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
            for off in F16_FIELDS.get(name, []):
                d = (rng.standard_normal(n_blocks) * 0.05).astype(np.float16)
                raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
            if name == "Q8_K":
                d = (rng.standard_normal(n_blocks) * 0.01).astype(np.float32)
                raw[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
            raw = raw.reshape(1, -1)
        if name == "Q8_K":
            # The gguf package has no Q8_K decoder: f32 d, 256 int8, 16 int16 sums; value = q * d.
            b = raw.reshape(n_blocks, size)
            d = b[:, 0:4].copy().view(np.float32)
            ref = (b[:, 4:260].view(np.int8).astype(np.float32) * d).reshape(1, -1)
        else:
            ref = gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(1, -1)
        w.add_tensor(f"{name}.q", raw, raw_dtype=qt)
        w.add_tensor(f"{name}.f32", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
