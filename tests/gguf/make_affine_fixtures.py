#!/usr/bin/env python3
"""Reference fixture for mlex's MLX affine quantizer (src/convert/affine.rs).

Quantizes a small f32 matrix with MLX's own `mx.quantize` (affine mode, CPU) for every supported
(bits, group_size) and saves inputs and outputs to a safetensors file. The Rust test
`affine_matches_mlx_quantize` compares our packing, scales and biases with these bit for bit.

Usage: python make_affine_fixtures.py OUT.safetensors      (needs: pip install mlx mlx-cpu)
"""
import sys

import numpy as np
import mlx.core as mx


def main():
    rng = np.random.default_rng(7)
    cols = 128
    rows = [
        rng.standard_normal(cols) * 0.02,                 # typical weights
        rng.random(cols),                                  # all positive
        -np.abs(rng.standard_normal(cols)),                # all negative
        np.where(rng.random(cols) < 0.1, rng.standard_normal(cols), 0.0),  # mostly zero
    ]
    w = np.stack(rows).astype(np.float32)
    w[3, :32] = 0.0  # an all-zero group
    w[3, 32:64] = 0.25  # a constant group
    mx.set_default_device(mx.cpu)
    wm = mx.array(w)
    out = {"w": wm}
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64, 128):
            q, s, b = mx.quantize(wm, group_size=gs, bits=bits)
            out[f"b{bits}_g{gs}.weight"] = q
            out[f"b{bits}_g{gs}.scales"] = s
            out[f"b{bits}_g{gs}.biases"] = b
    mx.save_safetensors(sys.argv[1], out)


if __name__ == "__main__":
    main()
