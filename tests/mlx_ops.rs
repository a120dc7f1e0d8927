//! Each MLX op we wrap, checked against a naive Rust computation of the same thing.
use mlex::mlx::{fast, quant, Array, Dtype, QuantMode};

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    // xorshift: deterministic, no dependency.
    let mut s = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn arr(v: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "length");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "element {i}: {x} vs {y}");
    }
}

fn naive_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|t| a[i * k + t] * b[t * n + j]).sum();
        }
    }
    out
}

#[test]
fn elementwise_and_reductions() {
    let a = rand_vec(12, 1);
    let b = rand_vec(12, 2);
    let (x, y) = (arr(&a, &[3, 4]), arr(&b, &[3, 4]));
    close(&x.add(&y).unwrap().to_vec::<f32>().unwrap(), &a.iter().zip(&b).map(|(p, q)| p + q).collect::<Vec<_>>(), 1e-6);
    close(&x.multiply(&y).unwrap().to_vec::<f32>().unwrap(), &a.iter().zip(&b).map(|(p, q)| p * q).collect::<Vec<_>>(), 1e-6);
    close(&x.exp().unwrap().to_vec::<f32>().unwrap(), &a.iter().map(|p| p.exp()).collect::<Vec<_>>(), 1e-6);
    close(&x.silu().unwrap().to_vec::<f32>().unwrap(), &a.iter().map(|p| p / (1.0 + (-p).exp())).collect::<Vec<_>>(), 1e-6);
    let rows: Vec<f32> = (0..3).map(|r| a[r * 4..r * 4 + 4].iter().sum()).collect();
    close(&x.sum(&[1], false).unwrap().to_vec::<f32>().unwrap(), &rows, 1e-6);
    let lse: Vec<f32> = (0..3).map(|r| a[r * 4..r * 4 + 4].iter().map(|v| v.exp()).sum::<f32>().ln()).collect();
    close(&x.logsumexp(&[-1], false).unwrap().to_vec::<f32>().unwrap(), &lse, 1e-5);
    let am: Vec<u32> = (0..3)
        .map(|r| (0..4).max_by(|&i, &j| a[r * 4 + i].partial_cmp(&a[r * 4 + j]).unwrap()).unwrap() as u32)
        .collect();
    assert_eq!(x.argmax(-1, false).unwrap().to_vec::<u32>().unwrap(), am);
    let sm = x.softmax(-1, true).unwrap().to_vec::<f32>().unwrap();
    for r in 0..3 {
        let e: Vec<f32> = a[r * 4..r * 4 + 4].iter().map(|v| v.exp()).collect();
        let s: f32 = e.iter().sum();
        close(&sm[r * 4..r * 4 + 4], &e.iter().map(|v| v / s).collect::<Vec<_>>(), 1e-6);
    }
}

#[test]
fn matmul_and_shapes() {
    let (m, k, n) = (5, 7, 3);
    let a = rand_vec(m * k, 3);
    let b = rand_vec(k * n, 4);
    let got = arr(&a, &[m as i32, k as i32]).matmul(&arr(&b, &[k as i32, n as i32])).unwrap();
    assert_eq!(got.shape(), vec![5, 3]);
    close(&got.to_vec::<f32>().unwrap(), &naive_matmul(&a, &b, m, k, n), 1e-5);
    let t = arr(&a, &[m as i32, k as i32]).transpose(&[1, 0]).unwrap();
    let tv = t.to_vec::<f32>().unwrap();
    assert_eq!(tv[1 * m + 2], a[2 * k + 1]);
    let parts = arr(&a, &[m as i32, k as i32]).split_at(&[2], 0).unwrap();
    assert_eq!(parts[0].shape(), vec![2, 7]);
    assert_eq!(parts[1].shape(), vec![3, 7]);
    let cat = Array::concatenate(&[&parts[1], &parts[0]], 0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&cat[..k], &a[2 * k..3 * k]);
    let z = Array::zeros(&[2, 4], Dtype::Float32).unwrap();
    let upd = z.slice_update(&arr(&[1.0, 2.0], &[1, 2]), &[1, 1], &[2, 3]).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(upd, vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0]);
    let idx = Array::from_slice(&[2u32, 0], &[2]).unwrap();
    let rows = arr(&a, &[m as i32, k as i32]).take(&idx, 0).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&rows[..k], &a[2 * k..3 * k]);
    assert_eq!(&rows[k..], &a[..k]);
    let c = arr(&[1.0, 2.0, 3.0], &[3]).cumsum(0, false, true).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(c, vec![1.0, 3.0, 6.0]);
    let bf = arr(&[1.5, -2.25], &[2]).astype(Dtype::Bfloat16).unwrap();
    assert_eq!(bf.dtype(), Dtype::Bfloat16);
    assert_eq!(bf.to_vec::<f32>().unwrap(), vec![1.5, -2.25]);
}

#[test]
fn rms_norm_matches_naive() {
    let (rows, d) = (3, 16);
    let x = rand_vec(rows * d, 5);
    let w = rand_vec(d, 6);
    let eps = 1e-5f32;
    let got = fast::rms_norm(&arr(&x, &[rows as i32, d as i32]), Some(&arr(&w, &[d as i32])), eps).unwrap();
    let mut want = vec![0f32; rows * d];
    for r in 0..rows {
        let row = &x[r * d..(r + 1) * d];
        let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for j in 0..d {
            want[r * d + j] = row[j] * inv * w[j];
        }
    }
    close(&got.to_vec::<f32>().unwrap(), &want, 1e-5);
}

#[test]
fn rope_matches_naive() {
    // [B=1, H=1, L=3, D=8], non-traditional (rotate halves), base 10000, offset 2.
    let (l, d, offset, base) = (3usize, 8usize, 2usize, 10000f32);
    let x = rand_vec(l * d, 7);
    let got = fast::rope(&arr(&x, &[1, 1, l as i32, d as i32]), d as i32, false, base, 1.0, offset as i32, None)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let half = d / 2;
    let mut want = vec![0f32; l * d];
    for p in 0..l {
        let pos = (p + offset) as f32;
        for i in 0..half {
            let theta = pos * base.powf(-((2 * i) as f32) / d as f32);
            let (a, b) = (x[p * d + i], x[p * d + i + half]);
            want[p * d + i] = a * theta.cos() - b * theta.sin();
            want[p * d + i + half] = a * theta.sin() + b * theta.cos();
        }
    }
    close(&got, &want, 1e-4);
}

#[test]
fn sdpa_matches_naive_causal_gqa() {
    // q: [1, 2 heads, 3, 4]; k/v: [1, 1 kv head, 3, 4]: both query heads share the kv head.
    let (hq, l, d) = (2usize, 3usize, 4usize);
    let q = rand_vec(hq * l * d, 8);
    let k = rand_vec(l * d, 9);
    let v = rand_vec(l * d, 10);
    let scale = 0.5f32;
    let got = fast::scaled_dot_product_attention(
        &arr(&q, &[1, hq as i32, l as i32, d as i32]),
        &arr(&k, &[1, 1, l as i32, d as i32]),
        &arr(&v, &[1, 1, l as i32, d as i32]),
        scale,
        fast::AttentionMask::Causal,
    )
    .unwrap()
    .to_vec::<f32>()
    .unwrap();
    let mut want = vec![0f32; hq * l * d];
    for h in 0..hq {
        for i in 0..l {
            let qi = &q[(h * l + i) * d..(h * l + i + 1) * d];
            let scores: Vec<f32> =
                (0..=i).map(|j| qi.iter().zip(&k[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
            let mx = scores.iter().cloned().fold(f32::MIN, f32::max);
            let e: Vec<f32> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f32 = e.iter().sum();
            for c in 0..d {
                want[(h * l + i) * d + c] = (0..=i).map(|j| e[j] / z * v[j * d + c]).sum();
            }
        }
    }
    close(&got, &want, 1e-5);
}

#[test]
fn affine_quantization_round_trip_and_matmul() {
    let (out, inp) = (8usize, 64usize);
    let w = rand_vec(out * inp, 11);
    let wa = arr(&w, &[out as i32, inp as i32]);
    for (bits, group) in [(4, 32), (8, 64), (3, 64), (2, 32), (6, 32), (5, 64)] {
        let q = quant::quantize(&wa, group, bits, QuantMode::Affine).unwrap();
        assert_eq!(q.weight.dtype(), Dtype::Uint32);
        assert_eq!(q.weight.shape(), vec![out as i32, (inp * bits as usize / 32) as i32]);
        let deq = quant::dequantize(&q.weight, &q.scales, q.biases.as_ref(), group, bits, QuantMode::Affine).unwrap();
        let dv = deq.to_vec::<f32>().unwrap();
        // Per-group error bound: one quantization step of that group's range (MLX nudges the
        // bias so that zero is exactly representable, which can cost up to a step at the edges).
        let levels = ((1u32 << bits) - 1) as f32;
        for r in 0..out {
            for g in 0..inp / group as usize {
                let s = &w[r * inp + g * group as usize..r * inp + (g + 1) * group as usize];
                let (lo, hi) = s.iter().fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
                let step = (hi - lo) / levels;
                for j in 0..group as usize {
                    let i = r * inp + g * group as usize + j;
                    assert!((dv[i] - w[i]).abs() <= step * 1.0 + 1e-6, "bits {bits}: {} vs {}", dv[i], w[i]);
                }
            }
        }
        // quantized_matmul(x, w) == x @ dequantize(w).T
        let x = rand_vec(2 * inp, 12);
        let xa = arr(&x, &[2, inp as i32]);
        let got = quant::quantized_matmul(&xa, &q.weight, &q.scales, q.biases.as_ref(), true, group, bits, QuantMode::Affine)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let mut dt = vec![0f32; inp * out];
        for r in 0..out {
            for c in 0..inp {
                dt[c * out + r] = dv[r * inp + c];
            }
        }
        close(&got, &naive_matmul(&x, &dt, 2, inp, out), 1e-4);
    }
}

#[test]
fn unsupported_quantization_is_an_error_not_an_abort() {
    let wa = arr(&rand_vec(64, 13), &[1, 64]);
    let e = quant::quantize(&wa, 64, 7, QuantMode::Affine).unwrap_err();
    assert!(e.to_string().contains("MLX"), "{e}");
    let e = arr(&[1.0; 6], &[2, 3]).matmul(&arr(&[1.0; 6], &[2, 3])).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("shape") || e.to_string().contains("matmul"), "{e}");
}

#[test]
fn graph_census_counts_pending_ops_once_each() {
    let a = arr(&rand_vec(8, 7), &[2, 4]);
    let e = a.exp().unwrap();
    // `e` feeds two ops; a split has two outputs but is one operation.
    let s = e.add(&a).unwrap().multiply(&e).unwrap().split_at(&[2], 1).unwrap();
    let census = mlex::mlx::graph_census(&[&s[0], &s[1]]).unwrap();
    let count = |name: &str| census.iter().find(|(n, _)| n == name).map_or(0, |(_, c)| *c);
    assert_eq!((count("Exp"), count("Add"), count("Multiply"), count("Split")), (1, 1, 1, 1), "{census:?}");
    assert!(census.windows(2).all(|w| w[0].1 >= w[1].1), "most frequent first: {census:?}");
    mlex::mlx::eval(&[&s[0], &s[1]]).unwrap();
    assert!(mlex::mlx::graph_census(&[&s[0], &s[1]]).unwrap().is_empty(), "evaluated arrays have no pending ops");
}

/// mlex's own CPU kernel (`CpuQuantizedMatmul`: affine 2–8-bit, float32, evaluated weights)
/// against MLX's dequantize + matmul, at sizes that split the rows over the thread pool, with
/// one and several rows of input (37 and 100: a prompt chunk, the packed GEMM, with a last
/// partial superpanel and panel of weight rows and a k not a multiple of its block), and with an
/// input that is a non-contiguous view.
#[test]
fn cpu_quantized_matmul_kernel_matches_dequantize_then_matmul() {
    on_cpu();
    for (n, k) in [(1000i32, 512i32), (70, 320)] {
        check_cpu_quantized_matmul(n, k);
    }
}

fn check_cpu_quantized_matmul(n: i32, k: i32) {
    let wa = arr(&rand_vec((n * k) as usize, 21), &[n, k]);
    for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (8, 128), (2, 64), (3, 32), (5, 64), (6, 128)] {
        if k % group != 0 {
            continue;
        }
        let q = quant::quantize(&wa, group, bits, QuantMode::Affine).unwrap();
        let biases = q.biases.as_ref().unwrap();
        mlex::mlx::eval(&[&q.weight, &q.scales, biases]).unwrap();
        let deq = quant::dequantize(&q.weight, &q.scales, Some(biases), group, bits, QuantMode::Affine).unwrap();
        for rows in [1, 3, 37, 100] {
            // [k, rows] transposed: a non-contiguous [rows, k] view.
            let x = arr(&rand_vec((rows * k) as usize, 22 + rows as u64), &[k, rows]).transpose(&[1, 0]).unwrap();
            let got = quant::quantized_matmul(&x, &q.weight, &q.scales, Some(biases), true, group, bits, QuantMode::Affine)
                .unwrap();
            let census = mlex::mlx::graph_census(&[&got]).unwrap();
            assert!(census.iter().any(|(name, _)| name == "CpuQuantizedMatmul"), "bits {bits}: {census:?}");
            let want = x.matmul(&deq.transpose(&[1, 0]).unwrap()).unwrap();
            close(&got.to_vec::<f32>().unwrap(), &want.to_vec::<f32>().unwrap(), 1e-4);
        }
    }
}

/// 16-bit quantization scales and biases (float16, bfloat16: kept so on the CPU in a float32
/// model, `loader::weights::keeps_16bit_scales`) run our kernel (`CpuQuantizedMatmul`: the row
/// kernels for 1 and 3 rows, the packed GEMM for 40) and give the float32-scales result, since the
/// kernels widen the same values exactly. MLX's own kernel (ours declines a weight that is not
/// evaluated) accepts them too, with a float32 result; and an embedding lookup matches.
#[test]
fn cpu_quantized_matmul_reads_16bit_scales() {
    on_cpu();
    let (n, k) = (70i32, 320i32);
    let wa = arr(&rand_vec((n * k) as usize, 41), &[n, k]);
    for (bits, group) in [(4, 32), (4, 64), (8, 32), (3, 32)] {
        let q = quant::quantize(&wa, group, bits, QuantMode::Affine).unwrap();
        for dtype in [Dtype::Float16, Dtype::Bfloat16] {
            let s16 = q.scales.astype(dtype).unwrap();
            let b16 = q.biases.as_ref().unwrap().astype(dtype).unwrap();
            let s32 = s16.astype(Dtype::Float32).unwrap();
            let b32 = b16.astype(Dtype::Float32).unwrap();
            mlex::mlx::eval(&[&q.weight, &s16, &b16, &s32, &b32]).unwrap();
            for rows in [1, 3, 40] {
                let x = arr(&rand_vec((rows * k) as usize, 42 + rows as u64), &[rows, k]);
                let qmm = |s: &Array, b: &Array| {
                    quant::quantized_matmul(&x, &q.weight, s, Some(b), true, group, bits, QuantMode::Affine).unwrap()
                };
                let got = qmm(&s16, &b16);
                let census = mlex::mlx::graph_census(&[&got]).unwrap();
                assert!(census.iter().any(|(name, _)| name == "CpuQuantizedMatmul"), "{dtype:?} bits {bits}: {census:?}");
                assert_eq!(got.dtype(), Dtype::Float32);
                let want = qmm(&s32, &b32).to_vec::<f32>().unwrap();
                let got = got.to_vec::<f32>().unwrap();
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() <= 1e-6 * w.abs(), "{dtype:?} bits {bits} rows {rows} [{i}]: {g} vs {w}");
                }
            }
            // MLX's kernel: scales not evaluated yet, so ours declines.
            let lazy_s = q.scales.astype(dtype).unwrap();
            let lazy_b = q.biases.as_ref().unwrap().astype(dtype).unwrap();
            let x = arr(&rand_vec((3 * k) as usize, 43), &[3, k]);
            let got = quant::quantized_matmul(&x, &q.weight, &lazy_s, Some(&lazy_b), true, group, bits, QuantMode::Affine)
                .unwrap();
            let census = mlex::mlx::graph_census(&[&got]).unwrap();
            assert!(!census.iter().any(|(name, _)| name == "CpuQuantizedMatmul"), "{census:?}");
            assert_eq!(got.dtype(), Dtype::Float32);
            let want = quant::quantized_matmul(&x, &q.weight, &s32, Some(&b32), true, group, bits, QuantMode::Affine)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            close(&got.to_vec::<f32>().unwrap(), &want, 1e-5);
            // An embedding lookup (QuantWeight::dequantize) widens them before MLX's dequantize.
            let spec = mlex::loader::QuantSpec { group_size: group as u32, bits: bits as u32, mode: QuantMode::Affine };
            let emb = mlex::nn::embedding::Embedding::Quantized(mlex::nn::linear::QuantWeight {
                weight: q.weight.clone(),
                scales: s16.clone(),
                biases: Some(b16.clone()),
                spec,
                dequant_dtype: Some(Dtype::Float32),
            });
            let ids = Array::from_slice(&[3u32, 0, 69, 3], &[2, 2]).unwrap();
            let got = emb.forward(&ids).unwrap();
            assert_eq!(got.dtype(), Dtype::Float32);
            let want = quant::dequantize(&q.weight, &s32, Some(&b32), group, bits, QuantMode::Affine)
                .unwrap()
                .take(&ids, 0)
                .unwrap();
            assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        }
    }
}

/// The same on the portable (non-AVX2) path.
#[test]
fn cpu_quantized_matmul_reads_16bit_scales_portable_path() {
    rerun_without_avx2("cpu_quantized_matmul_reads_16bit_scales");
}

/// A dense layer's product with many rows of x on the CPU (`x @ w_t`, `w_t` the evaluated
/// transposed view of a float32 `[out, in]` weight, as `Linear` holds it) runs our packed GEMM
/// (`CpuDenseMatmul`), with or without a bias (addmm), for widths that are not multiples of the
/// GEMM's blocks, a 3-D x and an x that is a view; up to 32 rows run the row kernel
/// (`cpu_dense_rows.h`), each row bit for bit as alone; a weight used as is (not a transposed view)
/// keeps MLX's matmul. Each against a naive product.
#[test]
fn cpu_dense_matmul_matches_naive() {
    on_cpu();
    for (m, k, n) in [(40usize, 320usize, 70usize), (100, 77, 1000), (33, 8, 17)] {
        let w = rand_vec(n * k, 81);
        let wa = arr(&w, &[n as i32, k as i32]);
        let w_t = wa.transpose(&[1, 0]).unwrap();
        mlex::mlx::eval(&[&wa, &w_t]).unwrap();
        let mut wt = vec![0f32; k * n];
        for r in 0..n {
            for c in 0..k {
                wt[c * n + r] = w[r * k + c];
            }
        }
        let x = rand_vec(m * k, 82);
        let want = naive_matmul(&x, &wt, m, k, n);
        let uses = |a: &Array, kernel: bool| {
            let census = mlex::mlx::graph_census(&[a]).unwrap();
            assert_eq!(census.iter().any(|(p, _)| p == "CpuDenseMatmul"), kernel, "{m}x{k}x{n}: {census:?}");
        };
        // [m, k], and [2, m/2, k] for even m.
        let xa = arr(&x, &[m as i32, k as i32]);
        let got = xa.matmul(&w_t).unwrap();
        uses(&got, true);
        close(&got.to_vec::<f32>().unwrap(), &want, 1e-4);
        if m % 2 == 0 {
            let got = arr(&x, &[2, (m / 2) as i32, k as i32]).matmul(&w_t).unwrap();
            uses(&got, true);
            close(&got.to_vec::<f32>().unwrap(), &want, 1e-4);
        }
        // x as a non-contiguous view: the transpose of its [k, m] transpose.
        let xt: Vec<f32> = (0..k * m).map(|i| x[(i % m) * k + i / m]).collect();
        let view = arr(&xt, &[k as i32, m as i32]).transpose(&[1, 0]).unwrap();
        let got = view.matmul(&w_t).unwrap();
        uses(&got, true);
        close(&got.to_vec::<f32>().unwrap(), &want, 1e-4);
        // With a bias.
        let bias = rand_vec(n, 83);
        let got = Array::addmm(&arr(&bias, &[n as i32]), &xa, &w_t, 1.0, 1.0).unwrap();
        uses(&got, true);
        let with_bias: Vec<f32> = want.iter().enumerate().map(|(i, v)| v + bias[i % n]).collect();
        close(&got.to_vec::<f32>().unwrap(), &with_bias, 1e-4);
        // MLX's matmul: a weight that is not a transposed view.
        let plain = xa.matmul(&arr(&wt, &[k as i32, n as i32])).unwrap();
        uses(&plain, false);
        close(&plain.to_vec::<f32>().unwrap(), &want, 1e-4);
        // Up to 32 rows (decode steps [B, 1, k], a short chunk [1, L, k], [M, k]): the row
        // kernel, each row bit for bit what it is alone (a batch's rows equal their single-row
        // steps), whatever rows share the product.
        let alone: Vec<Vec<f32>> = (0..8).map(|r| arr(&x[r * k..(r + 1) * k], &[1, 1, k as i32]).matmul(&w_t).unwrap().to_vec::<f32>().unwrap()).collect();
        for (i, a) in alone.iter().enumerate() {
            close(a, &want[i * n..(i + 1) * n], 1e-4);
        }
        for shape in [vec![8, 1, k as i32], vec![1, 8, k as i32], vec![8, k as i32], vec![2, 4, k as i32]] {
            let few = arr(&x[..8 * k], &shape).matmul(&w_t).unwrap();
            uses(&few, true);
            let got = few.to_vec::<f32>().unwrap();
            for (r, a) in alone.iter().enumerate() {
                let row = &got[r * n..(r + 1) * n];
                assert!(row.iter().zip(a).all(|(p, q)| p.to_bits() == q.to_bits()), "{shape:?}: row {r} differs from the row alone");
            }
        }
        let bias_few = Array::addmm(&arr(&bias, &[n as i32]), &arr(&x[..3 * k], &[3, 1, k as i32]), &w_t, 1.0, 1.0).unwrap();
        uses(&bias_few, true);
        close(&bias_few.to_vec::<f32>().unwrap(), &with_bias[..3 * n], 1e-4);
    }
}

/// A prompt chunk's rows (the packed GEMM) are each computed the same whatever other rows share
/// the chunk: the first 40 rows of a 100-row product are bit for bit the 40-row product's.
#[test]
fn cpu_quantized_gemm_rows_do_not_depend_on_the_chunk() {
    on_cpu();
    let (n, k) = (200i32, 768i32);
    let q = quant::quantize(&arr(&rand_vec((n * k) as usize, 71), &[n, k]), 64, 4, QuantMode::Affine).unwrap();
    let biases = q.biases.as_ref().unwrap();
    mlex::mlx::eval(&[&q.weight, &q.scales, biases]).unwrap();
    let x = arr(&rand_vec((100 * k) as usize, 72), &[100, k]);
    let mm = |x: &Array| {
        quant::quantized_matmul(x, &q.weight, &q.scales, Some(biases), true, 64, 4, QuantMode::Affine).unwrap().to_vec::<f32>().unwrap()
    };
    let all = mm(&x);
    let first = mm(&x.slice_axis(0, 0, 40).unwrap().contiguous().unwrap());
    assert!(first.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()), "row results depend on the chunk");
}

/// The packed GEMM (a prompt chunk's product, cpu_gemm.cpp) is, for each output, the sum over k
/// of x · (scale · q + bias), each product added with one rounding (a fused multiply-add) in k
/// order within blocks of 256 k (its `kKc`), the blocks' sums added in order: bit for bit, with
/// float32, float16 and bfloat16 scales, superpanels of 64, 48 and 8 weight rows (partial ones padded with
/// zeros), a last k block of 64, and groups of 32, 64 and 128. The AVX-512 4-bit dequantization
/// (`pack_q4_avx512`) takes most of these; the test runs again without it (below) and, in
/// `cpu_avx2_paths_match_too`, without AVX-512.
#[test]
fn cpu_quantized_gemm_is_the_blocked_fused_sum() {
    on_cpu();
    mlex::ablation::get(); // hands MLEX_ABLATE_* (the child run below) to the kernels
    const KC: usize = 256;
    for (n, k, group) in [(176i32, 576i32, 64i32), (200, 320, 32), (64, 512, 128)] {
        let wa = arr(&rand_vec((n * k) as usize, 81), &[n, k]);
        let q = quant::quantize(&wa, group, 4, QuantMode::Affine).unwrap();
        let biases = q.biases.as_ref().unwrap();
        for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
            let (s, b) = (q.scales.astype(dtype).unwrap(), biases.astype(dtype).unwrap());
            mlex::mlx::eval(&[&q.weight, &s, &b]).unwrap();
            let rows = 40usize;
            let x = rand_vec(rows * k as usize, 82);
            let got = quant::quantized_matmul(&arr(&x, &[rows as i32, k]), &q.weight, &s, Some(&b), true, group, 4, QuantMode::Affine)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let words = q.weight.to_vec::<u32>().unwrap();
            let sf = s.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
            let bf = b.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
            let (n, k, group) = (n as usize, k as usize, group as usize);
            let groups = k / group;
            let w = |r: usize, c: usize| {
                let q = (words[r * k / 8 + c / 8] >> (4 * (c % 8))) & 0xF;
                sf[r * groups + c / group].mul_add(q as f32, bf[r * groups + c / group])
            };
            for m in 0..rows {
                for r in 0..n {
                    let mut total = 0f32;
                    for k0 in (0..k).step_by(KC) {
                        let mut block = 0f32;
                        for c in k0..(k0 + KC).min(k) {
                            block = x[m * k + c].mul_add(w(r, c), block);
                        }
                        total = if k0 == 0 { block } else { total + block };
                    }
                    let g = got[m * n + r];
                    assert!(g.to_bits() == total.to_bits(), "n {n} k {k} group {group} {dtype:?}: [{m}, {r}] {g} vs {total}");
                }
            }
        }
    }
}

/// The same without the AVX-512 4-bit dequantization (the general one), in a child process.
#[test]
fn cpu_quantized_gemm_general_dequantization_too() {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["cpu_quantized_gemm_is_the_blocked_fused_sum", "--exact", "--test-threads", "1"])
        .env("MLEX_ABLATE_CPU_PACK_Q4", "1")
        .status()
        .unwrap();
    assert!(status.success(), "cpu_quantized_gemm_is_the_blocked_fused_sum with MLEX_ABLATE_CPU_PACK_Q4");
}

/// 8-bit activations (LoadOptions::int8_activations, src/mlx/cpu_matvec_vnni.h): each 32-value
/// block of x is rounded to 8 bits with d = max|x| / 127, and a product is
/// Σ_blocks scale_g · d · Σ q_w · q_x (integers, exact) + Σ_g bias_g · Σ x (x's exact sums). The
/// kernel's outputs equal that sum computed here in f64 to float32 rounding, for 4 and 8 bits,
/// groups of 32-128, float32 and 16-bit scales, an even and an odd number of blocks, 1-6 rows of
/// x (each row's bits as when it is alone); and they are the float products within the rounding
/// of x. On a CPU without AVX-512 VNNI the option changes nothing, which is checked instead.
#[test]
fn cpu_int8_activations_are_the_integer_block_sums() {
    on_cpu();
    let vnni = std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::env::var_os("MLEX_CPU_NO_AVX512").is_none();
    for (n, k) in [(70i32, 640i32), (37, 608)] {
        let wa = arr(&rand_vec((n * k) as usize, 91), &[n, k]);
        // 608 = 19 blocks of 32: groups of 32 only.
        for (bits, group) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64)].into_iter().filter(|(_, g)| k % g == 0) {
            let q = quant::quantize(&wa, group, bits, QuantMode::Affine).unwrap();
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                let s = q.scales.astype(dtype).unwrap();
                let b = q.biases.as_ref().unwrap().astype(dtype).unwrap();
                mlex::mlx::eval(&[&q.weight, &s, &b]).unwrap();
                let rows = 6usize;
                // Some blocks all zero (d = 0), one with a large outlier.
                let mut x = rand_vec(rows * k as usize, 92);
                x[32..64].iter_mut().for_each(|v| *v = 0.0);
                x[100] = 40.0;
                let mm = |x: &Array, int8: bool| {
                    mlex::mlx::set_cpu_int8_activations(int8);
                    let y = quant::quantized_matmul(x, &q.weight, &s, Some(&b), true, group, bits, QuantMode::Affine);
                    mlex::mlx::set_cpu_int8_activations(false);
                    y.unwrap().to_vec::<f32>().unwrap()
                };
                let xa = arr(&x, &[rows as i32, k]);
                let got = mm(&xa, true);
                let float = mm(&xa, false);
                let case = format!("n {n} k {k} bits {bits} group {group} {dtype:?}");
                if !vnni {
                    assert!(got.iter().zip(&float).all(|(a, b)| a.to_bits() == b.to_bits()), "{case}: no VNNI, yet other bits");
                    continue;
                }
                let words = q.weight.to_vec::<u32>().unwrap();
                let sf = s.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                let bf = b.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                let (n, k, group, bits) = (n as usize, k as usize, group as usize, bits as usize);
                let groups = k / group;
                let per_word = 32 / bits;
                let wq = |r: usize, c: usize| ((words[r * k / per_word + c / per_word] >> (bits * (c % per_word))) & ((1 << bits) - 1)) as i64;
                for m in 0..rows {
                    let xr = &x[m * k..(m + 1) * k];
                    let (mut d, mut xq) = (vec![0f32; k / 32], vec![0i64; k]);
                    for blk in 0..k / 32 {
                        let amax = xr[blk * 32..blk * 32 + 32].iter().fold(0f32, |a, v| a.max(v.abs()));
                        d[blk] = amax / 127.0;
                        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                        for i in blk * 32..blk * 32 + 32 {
                            xq[i] = ((xr[i] * id).round_ties_even() as i64).clamp(-127, 127);
                        }
                    }
                    for r in 0..n {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for blk in 0..k / 32 {
                            let dot: i64 = (blk * 32..blk * 32 + 32).map(|c| wq(r, c) * xq[c]).sum();
                            let c = (sf[r * groups + blk * 32 / group] * d[blk]) as f64;
                            want += c * dot as f64;
                            mag += (c * dot as f64).abs();
                        }
                        for g in 0..groups {
                            let xs = xr[g * group..(g + 1) * group].iter().fold(0f32, |a, v| a + v);
                            want += bf[r * groups + g] as f64 * xs as f64;
                            mag += (bf[r * groups + g] as f64 * xs as f64).abs();
                        }
                        let g = got[m * n + r] as f64;
                        assert!((g - want).abs() <= 1e-5 * (1.0 + mag), "{case}: [{m}, {r}] {g} vs {want}");
                        // Within the rounding of x (half a step of each block's d) of the float product.
                        let bound: f64 = (0..k).map(|c| (sf[r * groups + c / group] as f64 * wq(r, c) as f64).abs() * d[c / 32] as f64 * 0.5).sum();
                        let f = float[m * n + r] as f64;
                        assert!((g - f).abs() <= bound * 1.01 + 1e-4 * (1.0 + f.abs()), "{case}: [{m}, {r}] {g} vs float {f} (bound {bound})");
                    }
                    // A row alone: the same bits as in the batch.
                    let one = mm(&xa.slice_axis(0, m as i32, m as i32 + 1).unwrap().contiguous().unwrap(), true);
                    assert!(one.iter().zip(&got[m * n..(m + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits()), "{case}: row {m} alone");
                }
                assert!(got.iter().zip(&float).any(|(a, b)| a != b), "{case}: the int8 path did not run");
            }
        }
    }
}

/// A decode step's rows (the matrix-vector kernels, 1 to 32 rows of x: a continuous batch) are
/// each computed as that row alone would be, bit for bit, whatever the batch: a batched request's
/// tokens and logprobs do not depend on who else is decoding. Every bit width, 16-bit and float32
/// scales, a row count (70) that leaves a partial block of weight rows.
#[test]
fn cpu_quantized_matvec_rows_do_not_depend_on_the_batch() {
    on_cpu();
    let (n, k) = (70i32, 640i32);
    let wa = arr(&rand_vec((n * k) as usize, 73), &[n, k]);
    for (bits, group) in [(4, 32), (4, 128), (8, 64), (2, 32), (3, 64), (5, 32), (6, 128)] {
        let q = quant::quantize(&wa, group, bits, QuantMode::Affine).unwrap();
        for dtype in [Dtype::Float32, Dtype::Float16] {
            let s = q.scales.astype(dtype).unwrap();
            let b = q.biases.as_ref().unwrap().astype(dtype).unwrap();
            mlex::mlx::eval(&[&q.weight, &s, &b]).unwrap();
            let x = arr(&rand_vec((5 * k) as usize, 74), &[5, k]);
            let mm = |x: &Array| {
                quant::quantized_matmul(x, &q.weight, &s, Some(&b), true, group, bits, QuantMode::Affine).unwrap().to_vec::<f32>().unwrap()
            };
            let all = mm(&x);
            for r in 0..5 {
                let one = mm(&x.slice_axis(0, r, r + 1).unwrap().contiguous().unwrap());
                let row = &all[(r * n) as usize..((r + 1) * n) as usize];
                assert!(one.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()), "bits {bits} {dtype:?}: row {r} differs in a batch of 5");
            }
        }
    }
}

/// The AVX2 kernels on a machine that has AVX-512 (whose kernels take the matrix-vector products,
/// the prompt chunks' GEMM, attention rows, exp), in child processes: the same checks as above.
#[test]
fn cpu_avx2_paths_match_too() {
    for name in [
        "cpu_quantized_matmul_kernel_matches_dequantize_then_matmul",
        "cpu_quantized_matmul_reads_16bit_scales",
        "cpu_quantized_matvec_rows_do_not_depend_on_the_batch",
        "cpu_fast_ops_match_naive_on_views_and_variants",
        "cpu_swiglu_equals_the_ops_bit_for_bit",
        "cpu_logsumexp_equals_mlx_bit_for_bit",
        "cpu_quantized_gemm_rows_do_not_depend_on_the_chunk",
        "cpu_quantized_gemm_is_the_blocked_fused_sum",
        "cpu_dense_matmul_matches_naive",
    ] {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--test-threads", "1"])
            .env("MLEX_CPU_NO_AVX512", "1")
            .status()
            .unwrap();
        assert!(status.success(), "{name} without AVX-512");
    }
}

/// The same check on the portable (non-AVX2) path, in a child process since the choice is made
/// once per process.
#[test]
fn cpu_quantized_matmul_portable_path_matches_too() {
    rerun_without_avx2("cpu_quantized_matmul_kernel_matches_dequantize_then_matmul");
}

/// Our CPU kernels' tests run on the CPU whatever the machine's default device (on a CUDA
/// machine MLX defaults to the GPU).
fn on_cpu() {
    mlex::mlx::set_default_device(mlex::mlx::Device::Cpu).unwrap();
}

/// Runs the test `name` of this binary again in a child process that may not use AVX2.
fn rerun_without_avx2(name: &str) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads", "1"])
        .env("MLEX_CPU_QMM_SCALAR", "1")
        .status()
        .unwrap();
    assert!(status.success(), "{name} without AVX2");
}

/// mlex's CUDA matrix-vector kernel (`mlex_qmv4`: up to 32 rows of x, affine 4-bit, bfloat16/float16)
/// against MLX's dequantize + matmul in float32, for every group size, a row count that leaves a
/// block partly empty, and an input view that is not 16-byte aligned. Runs only where the CUDA
/// backend is (the GPU machine, see BENCHMARKS.md); elsewhere it has nothing to check.
#[test]
fn cuda_quantized_matvec_matches_dequantize_then_matmul() {
    use mlex::mlx::{gpu_available, set_default_device, Device};
    if !gpu_available() || cfg!(target_os = "macos") {
        eprintln!("no CUDA GPU: skipped");
        return;
    }
    set_default_device(Device::Gpu).unwrap();
    for (n, k) in [(1001i32, 512i32), (4608, 3584), (64, 18944)] {
        let wa = arr(&rand_vec((n * k) as usize, 31), &[n, k]);
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            for group in [32, 64, 128] {
                let q = quant::quantize(&wa.astype(dtype).unwrap(), group, 4, QuantMode::Affine).unwrap();
                let biases = q.biases.as_ref().unwrap();
                mlex::mlx::eval(&[&q.weight, &q.scales, biases]).unwrap();
                let deq = quant::dequantize(&q.weight, &q.scales, Some(biases), group, 4, QuantMode::Affine)
                    .unwrap()
                    .astype(Dtype::Float32)
                    .unwrap();
                // One element past the start of a buffer: a view that is not 16-byte aligned.
                let wide = arr(&rand_vec((k + 1) as usize, 32), &[1, 1, k + 1]).astype(dtype).unwrap();
                mlex::mlx::eval(&[&wide]).unwrap();
                for x in [wide.slice_axis(2, 0, k).unwrap(), wide.slice_axis(2, 1, k + 1).unwrap()] {
                    let got = quant::quantized_matmul(&x, &q.weight, &q.scales, Some(biases), true, group, 4, QuantMode::Affine)
                        .unwrap();
                    let census = mlex::mlx::graph_census(&[&got]).unwrap();
                    assert!(census.iter().any(|(name, _)| is_our_cuda_kernel(name)), "{n}x{k} g{group}: {census:?}");
                    assert_eq!(got.shape(), vec![1, 1, n]);
                    let want = x.astype(Dtype::Float32).unwrap().matmul(&deq.transpose(&[1, 0]).unwrap()).unwrap();
                    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
                    // bfloat16 output: a relative rounding of 2^-8, on sums of k terms.
                    let scale = w.iter().map(|v| v.abs()).fold(0f32, f32::max);
                    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                        assert!((a - b).abs() <= 1e-2 * scale, "{n}x{k} {dtype:?} g{group} row {i}: {a} vs {b}");
                    }
                }
                // Several rows of x (a continuous batch's decode step, every bucket and a row
                // count that leaves a bucket part empty): each row exactly what it gets alone.
                for m in [2i32, 3, 8, 13, 32] {
                    let xs = arr(&rand_vec((m * k) as usize, 33 + m as u64), &[m, 1, k]).astype(dtype).unwrap();
                    let got = quant::quantized_matmul(&xs, &q.weight, &q.scales, Some(biases), true, group, 4, QuantMode::Affine)
                        .unwrap();
                    let census = mlex::mlx::graph_census(&[&got]).unwrap();
                    assert!(census.iter().any(|(name, _)| is_our_cuda_kernel(name)), "{m} rows: {census:?}");
                    assert_eq!(got.shape(), vec![m, 1, n]);
                    let got = got.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                    for r in [0, m / 2, m - 1] {
                        let row = xs.slice_axis(0, r, r + 1).unwrap();
                        let alone = quant::quantized_matmul(&row, &q.weight, &q.scales, Some(biases), true, group, 4, QuantMode::Affine)
                            .unwrap()
                            .astype(Dtype::Float32)
                            .unwrap()
                            .to_vec::<f32>()
                            .unwrap();
                        assert_eq!(&got[(r * n) as usize..((r + 1) * n) as usize], &alone[..], "{n}x{k} {dtype:?} g{group}: row {r} of {m}");
                    }
                }
            }
        }
    }
}

/// mlex's own CPU kernels for RMSNorm, RoPE and attention (`src/mlx/cpu_fast_ops.cpp`)
/// against naive Rust, on the cases the plain tests above leave out: inputs that are views
/// (transposed, a slice of a larger KV buffer), no weight, traditional pairs, given frequencies,
/// rotating only part of the features, scaled positions, grouped-query heads, a batch of two,
/// causal prefill rows after a cached prefix.
#[test]
fn cpu_fast_ops_match_naive_on_views_and_variants() {
    on_cpu();
    let used = |a: &Array, name: &str| {
        let census = mlex::mlx::graph_census(&[a]).unwrap();
        assert!(census.iter().any(|(n, _)| n == name), "{name} not used: {census:?}");
    };
    // RMSNorm of a transposed [4, 6] view (rows of 6 read with stride 4), no weight.
    let raw = rand_vec(24, 40);
    let x = arr(&raw, &[6, 4]).transpose(&[1, 0]).unwrap();
    let got = fast::rms_norm(&x, None, 1e-6).unwrap();
    used(&got, "CpuRmsNorm");
    let mut want = vec![];
    for r in 0..4 {
        let row: Vec<f32> = (0..6).map(|i| raw[i * 4 + r]).collect();
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / 6.0 + 1e-6).sqrt();
        want.extend(row.iter().map(|v| v * inv));
    }
    close(&got.to_vec::<f32>().unwrap(), &want, 1e-5);

    // RoPE on [2, 3, L=2, D=10] built as a transpose of [2, 2, 3, 10] (a view), rotating 8 of 10.
    let (b, h, l, d, dims) = (2usize, 3usize, 2usize, 10usize, 8usize);
    let raw = rand_vec(b * h * l * d, 41);
    let x = arr(&raw, &[b as i32, l as i32, h as i32, d as i32]).transpose(&[0, 2, 1, 3]).unwrap();
    let at = |bi: usize, hi: usize, li: usize, i: usize| raw[((bi * l + li) * h + hi) * d + i];
    let freqs: Vec<f32> = (0..dims / 2).map(|i| 1.0 + 3.0 * i as f32).collect();
    for (traditional, with_freqs, scale, offset) in [(false, false, 1.0f32, 5usize), (true, false, 0.5, 0), (false, true, 0.25, 7)] {
        let f = arr(&freqs, &[(dims / 2) as i32]);
        let got = fast::rope(&x, dims as i32, traditional, 500.0, scale, offset as i32, with_freqs.then_some(&f)).unwrap();
        used(&got, "CpuRope");
        let mut want = vec![0f32; b * h * l * d];
        for (bi, hi, li) in (0..b).flat_map(|bi| (0..h).flat_map(move |hi| (0..l).map(move |li| (bi, hi, li)))) {
            let o = &mut want[((bi * h + hi) * l + li) * d..][..d];
            for i in 0..d {
                o[i] = at(bi, hi, li, i);
            }
            let pos = (li + offset) as f32 * scale;
            for i in 0..dims / 2 {
                let inv = if with_freqs { 1.0 / freqs[i] } else { (-(i as f32) * (500f32.ln() / (dims / 2) as f32)).exp() };
                let (i1, i2) = if traditional { (2 * i, 2 * i + 1) } else { (i, i + dims / 2) };
                let (x1, x2, t) = (at(bi, hi, li, i1), at(bi, hi, li, i2), pos * inv);
                o[i1] = x1 * t.cos() - x2 * t.sin();
                o[i2] = x1 * t.sin() + x2 * t.cos();
            }
        }
        close(&got.to_vec::<f32>().unwrap(), &want, 1e-4);
    }

    // Attention: one query, 4 query heads over 2 KV heads, batch 2, keys/values the first 5 of 8
    // slots; a context long enough for the SIMD loops and the thread pool (8 heads x 300 keys x
    // 64); causal prefill rows, the last L of S positions (a cached prefix of S - L); the head
    // widths of the AVX-512 kernel (64, 128, 256).
    let cases = [(2usize, 4usize, 2usize, 1usize, 5usize, 8usize, 6usize, false), (1, 8, 2, 1, 300, 320, 64, false),
                 (2, 4, 2, 3, 5, 8, 6, true), (1, 8, 2, 40, 100, 128, 64, true), (2, 4, 1, 1, 37, 40, 128, false),
                 (1, 2, 2, 2, 9, 9, 256, true)];
    for (b, hq, hkv, l, s, cap, d, causal) in cases {
        let q = rand_vec(b * hq * l * d, 42);
        let kb = rand_vec(b * hkv * cap * d, 43);
        let vb = rand_vec(b * hkv * cap * d, 44);
        let shape = [b as i32, hkv as i32, cap as i32, d as i32];
        let k = arr(&kb, &shape).slice_axis(2, 0, s as i32).unwrap();
        let v = arr(&vb, &shape).slice_axis(2, 0, s as i32).unwrap();
        let qa = arr(&q, &[b as i32, hq as i32, l as i32, d as i32]);
        let mask = if causal { fast::AttentionMask::Causal } else { fast::AttentionMask::None };
        let got = fast::scaled_dot_product_attention(&qa, &k, &v, 0.4, mask).unwrap();
        used(&got, "CpuAttention");
        let mut want = vec![0f32; b * hq * l * d];
        for (bi, hi, li) in (0..b).flat_map(|bi| (0..hq).flat_map(move |hi| (0..l).map(move |li| (bi, hi, li)))) {
            let g = hi / (hq / hkv);
            let seen = if causal { s - l + li + 1 } else { s };
            let kv = |buf: &[f32], j: usize, c: usize| buf[((bi * hkv + g) * cap + j) * d + c];
            let row = ((bi * hq + hi) * l + li) * d;
            let scores: Vec<f32> = (0..seen).map(|j| (0..d).map(|c| q[row + c] * 0.4 * kv(&kb, j, c)).sum()).collect();
            let m = scores.iter().cloned().fold(f32::MIN, f32::max);
            let e: Vec<f32> = scores.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            for c in 0..d {
                want[row + c] = (0..seen).map(|j| e[j] / z * kv(&vb, j, c)).sum();
            }
        }
        close(&got.to_vec::<f32>().unwrap(), &want, 1e-5);
    }
}

/// The same checks on the portable (non-AVX2) loops, in a child process since the choice is made
/// once per process.
#[test]
fn cpu_fast_ops_portable_path_matches_too() {
    rerun_without_avx2("cpu_fast_ops_match_naive_on_views_and_variants");
}

/// mlex's CPU swiglu (`src/mlx/cpu_fast_ops.cpp`, instead of MLX's JIT-compiled kernel) against
/// MLX's own ops for `gate · sigmoid(gate) · up`, bit for bit: the halves of a fused gate/up
/// projection (views read in place), a decode row and a prefill chunk, values wide enough for
/// sigmoid's both branches and exp's cut-offs.
#[test]
fn cpu_swiglu_equals_the_ops_bit_for_bit() {
    on_cpu();
    for rows in [1usize, 37, 150] {
        let width = 300usize;
        let raw: Vec<f32> = rand_vec(rows * 2 * width, 50 + rows as u64).iter().map(|v| v * 100.0).collect();
        let fused = arr(&raw, &[1, rows as i32, 2 * width as i32]);
        let halves = fused.split_at(&[width as i32], -1).unwrap();
        let got = fast::swiglu(&halves[0], &halves[1]).unwrap();
        let census = mlex::mlx::graph_census(&[&got]).unwrap();
        assert!(census.iter().any(|(n, _)| n == "CpuSwiglu"), "CpuSwiglu not used: {census:?}");
        let want = halves[0].silu().unwrap().multiply(&halves[1]).unwrap();
        assert_eq!(got.shape(), want.shape());
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        for (i, (a, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), w.to_bits(), "rows {rows}, [{i}]: {a} vs {w}");
        }
    }
}

/// The same check on the portable loop (the one without AVX2/FMA), in a child process.
#[test]
fn cpu_swiglu_portable_path_matches_too() {
    rerun_without_avx2("cpu_swiglu_equals_the_ops_bit_for_bit");
}

/// mlex's CPU logsumexp over the last axis (`CpuLogSumExp`, the sampler's normalizer) against
/// MLX's own kernel, bit for bit: MLX's runs when the reduced axis is not the last one (a
/// transposed view). Rows of a vocabulary's width and of odd widths, logits wide enough for exp's
/// cut-offs, a row of one value, a row with -inf entries and a row that is all -inf.
#[test]
fn cpu_logsumexp_equals_mlx_bit_for_bit() {
    on_cpu();
    for (rows, width) in [(1usize, 49_152usize), (3, 1000), (2, 7), (1, 1)] {
        let mut raw: Vec<f32> = rand_vec(rows * width, 90 + width as u64).iter().map(|v| v * 40.0).collect();
        if rows > 1 && width > 3 {
            raw[1] = f32::NEG_INFINITY;
            raw[width..2 * width].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        }
        let x = arr(&raw, &[rows as i32, width as i32]);
        let got = x.logsumexp(&[-1], true).unwrap();
        let census = mlex::mlx::graph_census(&[&got]).unwrap();
        assert!(census.iter().any(|(n, _)| n == "CpuLogSumExp"), "CpuLogSumExp not used: {census:?}");
        assert_eq!(got.shape(), vec![rows as i32, 1]);
        let xt = arr(&raw, &[rows as i32, width as i32]).transpose(&[1, 0]).unwrap();
        let want = xt.logsumexp(&[0], false).unwrap();
        let census = mlex::mlx::graph_census(&[&want]).unwrap();
        assert!(!census.iter().any(|(n, _)| n == "CpuLogSumExp"), "{census:?}");
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        for (i, (a, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), w.to_bits(), "{rows}x{width}, row {i}: {a} vs {w}");
        }
    }
}

/// The same check on the portable loop, in a child process.
#[test]
fn cpu_logsumexp_portable_path_matches_too() {
    rerun_without_avx2("cpu_logsumexp_equals_mlx_bit_for_bit");
}

/// Inputs of a gated delta-net layer's recurrence: q/k/v read as slices of one wider tensor (as
/// the conv output is split), value heads sharing key heads, a batch of two, a non-zero state.
struct DeltaInputs {
    q: Array,
    k: Array,
    v: Array,
    a: Array,
    b: Array,
    a_log: Array,
    dt_bias: Array,
    state: Array,
}

fn delta_inputs(t: i32, dtype: Dtype) -> DeltaInputs {
    let (b, hk, hv, dk, dv) = (2i32, 2i32, 4i32, 64i32, 16i32);
    let width = 2 * hk * dk + hv * dv + 3;
    let mixed = arr(&rand_vec((b * t * width) as usize, 50 + t as u64), &[b, t, width]).astype(dtype).unwrap();
    let part = |from: i32, n: i32, heads: i32, d: i32| mixed.slice_axis(2, from, from + n).unwrap().reshape(&[b, t, heads, d]).unwrap();
    let gate_in = |seed| arr(&rand_vec((b * t * hv) as usize, seed), &[b, t, hv]).multiply(&Array::scalar_f32(3.0, Dtype::Float32).unwrap()).unwrap().astype(dtype).unwrap();
    DeltaInputs {
        q: part(1, hk * dk, hk, dk),
        k: part(1 + hk * dk, hk * dk, hk, dk),
        v: part(1 + 2 * hk * dk, hv * dv, hv, dv),
        a: gate_in(60),
        b: gate_in(61),
        a_log: arr(&rand_vec(hv as usize, 63), &[hv]),
        dt_bias: arr(&rand_vec(hv as usize, 64), &[hv]).astype(dtype).unwrap(),
        state: arr(&rand_vec((b * hv * dv * dk) as usize, 62), &[b, hv, dv, dk]),
    }
}

/// Every element of `got` within `tol` (relative to the largest of `want`) of `want`.
fn within(what: &str, got: &Array, want: &Array, tol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let f = |a: &Array| a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    let (got, want) = (f(got), f(want));
    let scale = want.iter().map(|v| v.abs()).fold(1f32, f32::max);
    for (i, (a, w)) in got.iter().zip(&want).enumerate() {
        assert!((a - w).abs() <= tol * scale, "{what}[{i}]: {a} vs {w}");
    }
}

/// The primitive one of our CUDA kernels runs as: ours (`src/mlx/cuda_launch.cpp`, the default),
/// or MLX's CustomKernel (`MLEX_CUDA_KERNEL_CACHE=0`, or where direct launches are unavailable).
fn is_our_cuda_kernel(primitive: &str) -> bool {
    primitive == "MlexCudaKernel" || primitive == "CustomKernel"
}

fn uses_our_cuda_kernel(arrays: &[&Array], what: &str) {
    let census = mlex::mlx::graph_census(arrays).unwrap();
    assert!(census.iter().any(|(n, _)| is_our_cuda_kernel(n)), "{what}: our CUDA kernel not used: {census:?}");
}

fn uses(arrays: &[&Array], kernel: &str, what: &str) {
    let census = mlex::mlx::graph_census(arrays).unwrap();
    assert!(census.iter().any(|(n, _)| n == kernel), "{what}: {kernel} not used: {census:?}");
}

/// The CPU gated delta kernel (`src/mlx/gated_delta.cpp`) against the graph of plain ops
/// (`nn::gated_delta::gated_delta_ops`, mlx-lm's `gated_delta_ops`), bit for bit: one token
/// (decode) and 37 (prefill), float32 and bfloat16.
#[test]
fn cpu_gated_delta_kernel_matches_ops_reference() {
    use mlex::mlx::{set_default_device, Device};
    use mlex::nn::gated_delta::{gated_delta, gated_delta_ops, gates, normalize_qk};
    set_default_device(Device::Cpu).unwrap();
    for t in [1i32, 37] {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let x = delta_inputs(t, dtype);
            let (q, k) = normalize_qk(&x.q, &x.k).unwrap();
            let (g, beta) = gates(&x.a, &x.b, &x.a_log, &x.dt_bias).unwrap();
            let (y, s) = gated_delta(&q, &k, &x.v, &g, &beta, &x.state).unwrap();
            let what = format!("T={t} {dtype:?}");
            uses(&[&y, &s], "CpuGatedDelta", &what);
            assert_eq!((y.dtype(), s.dtype()), (dtype, Dtype::Float32));
            let (yr, sr) = gated_delta_ops(&q, &k, &x.v, &g, &beta, &x.state).unwrap();
            within(&format!("{what} y"), &y, &yr, 0.0);
            within(&format!("{what} state"), &s, &sr, 0.0);
        }
    }
}

#[test]
fn cpu_gated_delta_portable_path_matches_too() {
    rerun_without_avx2("cpu_gated_delta_kernel_matches_ops_reference");
}

/// The CUDA kernel (normalize_qk, the gates and the recurrence in one) against the same ops on
/// the GPU: the warp sums run in another order, so float32 within rounding and bfloat16 within
/// its 2^-8 relative rounding. Runs only where the CUDA backend is (the GPU machine, see
/// BENCHMARKS.md).
/// A quantized product with the op that follows it folded in (the residual add after an
/// output projection, SwiGLU after a fused gate/up projection, the projection's bias) gives
/// exactly the unfused ops' values, on every device; on CUDA it is one kernel, for one row of x
/// and for a batch's rows, and on the CPU (float32) one op of ours (but for the bias).
#[test]
fn quantized_matmul_epilogues_equal_the_unfused_ops() {
    use mlex::mlx::quant::Epilogue;
    use mlex::mlx::{gpu_available, set_default_device, Device};
    let cuda = gpu_available() && !cfg!(target_os = "macos");
    if cuda {
        set_default_device(Device::Gpu).unwrap();
    }
    let dtypes: &[Dtype] = if cuda { &[Dtype::Bfloat16, Dtype::Float16] } else { &[Dtype::Float32, Dtype::Bfloat16] };
    // K = 16,384: rows long enough that the CUDA kernel splits each over several warps.
    for (n, k) in [(96i32, 256i32), (1024, 576), (64, 16384)] {
        let wa = arr(&rand_vec((n * k) as usize, 41), &[n, k]);
        for &dtype in dtypes {
            let q = quant::quantize(&wa.astype(dtype).unwrap(), 64, 4, QuantMode::Affine).unwrap();
            let biases = q.biases.as_ref().unwrap();
            for m in [1i32, 3, 8] {
                let what = format!("{n}x{k} {dtype:?} {m} rows");
                let x = arr(&rand_vec((m * k) as usize, 42 + m as u64), &[m, 1, k]).astype(dtype).unwrap();
                let res = arr(&rand_vec((m * n) as usize, 52 + m as u64), &[m, 1, n]).astype(dtype).unwrap();
                let bias = arr(&rand_vec(n as usize, 72), &[n]).astype(dtype).unwrap();
                mlex::mlx::eval(&[&x, &res, &bias, &q.weight, &q.scales, biases]).unwrap();
                let y = quant::quantized_matmul(&x, &q.weight, &q.scales, Some(biases), true, 64, 4, QuantMode::Affine).unwrap();
                let halves = y.split_at(&[n / 2], -1).unwrap();
                let cases = [
                    ("add", Epilogue::AddResidual(&res), res.add(&y).unwrap()),
                    ("swiglu", Epilogue::SwiGlu, fast::swiglu(&halves[0], &halves[1]).unwrap()),
                    ("bias", Epilogue::AddBias(&bias), y.add(&bias).unwrap()),
                ];
                for (name, epi, want) in cases {
                    let got =
                        quant::quantized_matmul_fused(&x, None, &q.weight, &q.scales, Some(biases), 64, 4, QuantMode::Affine, Some(epi))
                            .unwrap();
                    if cuda {
                        let census = mlex::mlx::graph_census(&[&got]).unwrap();
                        let kernels: usize = census.iter().filter(|(p, _)| is_our_cuda_kernel(p)).map(|(_, c)| c).sum();
                        assert_eq!((kernels, census.len()), (1, 1), "{what} {name}: one kernel, nothing else: {census:?}");
                    } else if dtype == Dtype::Float32 && name != "bias" {
                        // Our CPU kernel takes the epilogue too: one op (the bias add stays an op).
                        let census = mlex::mlx::graph_census(&[&got]).unwrap();
                        assert_eq!(census, vec![("CpuQuantizedMatmul".to_string(), 1)], "{what} {name}: {census:?}");
                    }
                    assert_eq!(got.shape(), want.shape(), "{what} {name}");
                    let (g, w) = (got.astype(Dtype::Float32).unwrap(), want.astype(Dtype::Float32).unwrap());
                    let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
                    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                        assert!(a.to_bits() == b.to_bits(), "{what} {name}: element {i}: {a} vs {b}");
                    }
                }
            }
        }
    }
}

/// A quantized product of RMS-normalized rows (a decoder layer's pre-norm folded into the q/k/v
/// or gate/up product), with and without the SwiGLU epilogue, against rms_norm then the product.
/// Off CUDA the same ops run, bit for bit. On CUDA it is one kernel whose sum of x² runs in
/// another order than MLX's RMSNorm, so a normalized element may round the other way: outputs
/// within two roundings of the activation type, and nearly all of them equal.
#[test]
fn quantized_matmul_with_the_norm_folded_in_matches_norm_then_product() {
    use mlex::mlx::quant::Epilogue;
    use mlex::mlx::{gpu_available, set_default_device, Device};
    let cuda = gpu_available() && !cfg!(target_os = "macos");
    if cuda {
        set_default_device(Device::Gpu).unwrap();
    }
    let dtypes: &[Dtype] = if cuda { &[Dtype::Bfloat16, Dtype::Float16] } else { &[Dtype::Float32, Dtype::Bfloat16] };
    for (n, k) in [(96i32, 256i32), (1024, 576)] {
        let wa = arr(&rand_vec((n * k) as usize, 61), &[n, k]);
        for &dtype in dtypes {
            let q = quant::quantize(&wa.astype(dtype).unwrap(), 64, 4, QuantMode::Affine).unwrap();
            let biases = q.biases.as_ref().unwrap();
            let nw = arr(&rand_vec(k as usize, 62), &[k]).add(&Array::scalar_f32(1.0, Dtype::Float32).unwrap()).unwrap().astype(dtype).unwrap();
            for m in [1i32, 3, 8] {
                let what = format!("{n}x{k} {dtype:?} {m} rows");
                // Rows of the residual stream at different scales.
                let x = arr(&rand_vec((m * k) as usize, 63 + m as u64), &[m, 1, k])
                    .multiply(&Array::scalar_f32(7.5, Dtype::Float32).unwrap())
                    .unwrap()
                    .astype(dtype)
                    .unwrap();
                mlex::mlx::eval(&[&x, &nw, &q.weight, &q.scales, biases]).unwrap();
                let xn = fast::rms_norm(&x, Some(&nw), 1e-6).unwrap();
                let y = quant::quantized_matmul(&xn, &q.weight, &q.scales, Some(biases), true, 64, 4, QuantMode::Affine).unwrap();
                let halves = y.split_at(&[n / 2], -1).unwrap();
                let cases = [("plain", None, y.clone()), ("swiglu", Some(Epilogue::SwiGlu), fast::swiglu(&halves[0], &halves[1]).unwrap())];
                for (name, epi, want) in cases {
                    let got = quant::quantized_matmul_fused(
                        &x,
                        Some((&nw, 1e-6)),
                        &q.weight,
                        &q.scales,
                        Some(biases),
                        64,
                        4,
                        QuantMode::Affine,
                        epi,
                    )
                    .unwrap();
                    let census = mlex::mlx::graph_census(&[&got]).unwrap();
                    if cuda {
                        let kernels: usize = census.iter().filter(|(p, _)| is_our_cuda_kernel(p)).map(|(_, c)| c).sum();
                        assert_eq!((kernels, census.len()), (1, 1), "{what} {name}: one kernel, nothing else: {census:?}");
                    } else if dtype == Dtype::Float32 && name == "plain" {
                        // Our CPU kernel normalizes x itself: no norm op of its own.
                        assert_eq!(census, vec![("CpuQuantizedMatmul".to_string(), 1)], "{what} {name}");
                    }
                    assert_eq!(got.shape(), want.shape(), "{what} {name}");
                    let (g, w) = (got.astype(Dtype::Float32).unwrap(), want.astype(Dtype::Float32).unwrap());
                    let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
                    let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
                    let mut equal = 0;
                    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                        if !cuda {
                            assert!(a.to_bits() == b.to_bits(), "{what} {name}: element {i}: {a} vs {b}");
                        }
                        assert!((a - b).abs() <= b.abs() / 64.0 + scale / 256.0, "{what} {name}: element {i}: {a} vs {b}");
                        equal += (a.to_bits() == b.to_bits()) as usize;
                    }
                    assert!(equal * 10 >= g.len() * 9, "{what} {name}: only {equal} of {} outputs equal", g.len());
                }
            }
        }
    }
}

/// q/k norms and rope of a decode step in one CUDA kernel, against MLX's four ops (RMSNorm of
/// each head, then rope), for both pairings, with and without precomputed frequencies (llama3
/// style), at one position or one per batch row. The sums and sines run in another order and
/// precision than MLX's kernels: within two roundings of the activation type and nearly all equal.
/// Off CUDA the kernel does not apply (None: the model runs the ops).
#[test]
fn cuda_qk_norm_rope_matches_norm_then_rope() {
    use mlex::mlx::{gpu_available, set_default_device, Device};
    let cuda = gpu_available() && !cfg!(target_os = "macos");
    if cuda {
        set_default_device(Device::Gpu).unwrap();
    }
    let (hq, hkv) = (4i32, 2i32);
    for d in [64i32, 128] {
        for &dtype in &[Dtype::Bfloat16, Dtype::Float16] {
            for b in [1i32, 3] {
                let qkv = arr(&rand_vec((b * (hq + 2 * hkv) * d) as usize, 71 + d as u64), &[b, hq + 2 * hkv, 1, d])
                    .multiply(&Array::scalar_f32(4.0, Dtype::Float32).unwrap())
                    .unwrap()
                    .astype(dtype)
                    .unwrap();
                let one = Array::scalar_f32(1.0, Dtype::Float32).unwrap();
                let qn = arr(&rand_vec(d as usize, 72), &[d]).add(&one).unwrap().astype(dtype).unwrap();
                let kn = arr(&rand_vec(d as usize, 73), &[d]).add(&one).unwrap().astype(dtype).unwrap();
                let llama3: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(2.0 * i as f32 / d as f32) * if i > d / 4 { 8.0 } else { 1.0 }).collect();
                let freqs = Array::from_slice(&llama3, &[d / 2]).unwrap();
                let rows: Vec<i32> = (0..b).map(|r| 7 + 1000 * r).collect();
                for (what_pos, positions) in [("one position", vec![3000i32]), ("per row", rows)] {
                    let pos = Array::from_slice(&positions, &[positions.len() as i32]).unwrap();
                    let per_row = pos.dim(0) == b;
                    for traditional in [false, true] {
                        for fr in [None, Some(&freqs)] {
                            let what = format!("d {d} {dtype:?} b {b} {what_pos} traditional {traditional} freqs {}", fr.is_some());
                            mlex::mlx::eval(&[&qkv, &qn, &kn, &pos]).unwrap();
                            let got = fast::cuda_qk_norm_rope(&qkv, (hq, hkv), &qn, &kn, 1e-6, traditional, 1e6, 1.0, fr, &pos).unwrap();
                            let Some((q, k)) = got else {
                                assert!(!cuda, "{what}: the kernel applies on CUDA");
                                continue;
                            };
                            let parts = qkv.split_at(&[hq, hq + hkv], 1).unwrap();
                            let rope = |x: &Array| -> Array {
                                if per_row {
                                    fast::rope_offsets(x, d, traditional, 1e6, 1.0, &pos, fr).unwrap()
                                } else {
                                    fast::rope(x, d, traditional, 1e6, 1.0, positions[0], fr).unwrap()
                                }
                            };
                            let want_q = rope(&fast::rms_norm(&parts[0], Some(&qn), 1e-6).unwrap());
                            let want_k = rope(&fast::rms_norm(&parts[1], Some(&kn), 1e-6).unwrap());
                            let census = mlex::mlx::graph_census(&[&q, &k]).unwrap();
                            let kernels: usize = census.iter().filter(|(p, _)| is_our_cuda_kernel(p)).map(|(_, c)| c).sum();
                            assert_eq!(kernels, 1, "{what}: one kernel: {census:?}");
                            for (name, g, w) in [("q", q, want_q), ("k", k, want_k)] {
                                assert_eq!(g.shape(), w.shape(), "{what} {name}");
                                let g = g.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                                let w = w.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                                let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
                                let mut equal = 0;
                                for (i, (a, c)) in g.iter().zip(&w).enumerate() {
                                    assert!((a - c).abs() <= c.abs() / 64.0 + scale / 256.0, "{what} {name}: element {i}: {a} vs {c}");
                                    equal += (a.to_bits() == c.to_bits()) as usize;
                                }
                                eprintln!("{what} {name}: {equal} of {} equal", g.len());
                                assert!(equal * 10 >= g.len() * 8, "{what} {name}: only {equal} of {} equal", g.len());
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A short pass's attention (2..16 queries over a cache's whole buffers, causal from an
/// offset) in one CUDA kernel, against MLX's attention over the keys each query may see (the
/// prefix, causal flag). Float32 and the half types; GQA; head sizes 64 and 128; a pass at the
/// start, after a prefix, and filling the buffer to its end; stale keys past the pass (what a
/// trim leaves) must stay unseen; q laid out by head or by token (a pass built as decode rows).
/// Off CUDA the kernel does not apply (None).
#[test]
fn cuda_short_attention_matches_attention_over_the_prefix() {
    use mlex::mlx::{gpu_available, set_default_device, Device};
    let cuda = gpu_available() && !cfg!(target_os = "macos");
    if cuda {
        set_default_device(Device::Gpu).unwrap();
    }
    let (b, hq, hkv, cap) = (2i32, 6i32, 2i32, 256i32);
    for d in [64i32, 128] {
        for &dtype in &[Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            let k = arr(&rand_vec((b * hkv * cap * d) as usize, 90 + d as u64), &[b, hkv, cap, d]).astype(dtype).unwrap();
            let v = arr(&rand_vec((b * hkv * cap * d) as usize, 91 + d as u64), &[b, hkv, cap, d]).astype(dtype).unwrap();
            for ((prev, l), token_major) in [(0i32, 4i32), (37, 2), (100, 16), (cap - 5, 5)].into_iter().zip([false, true, false, true]) {
                let what = format!("d {d} {dtype:?} prev {prev} queries {l} token-major {token_major}");
                // Token-major: q as the pass built as decode rows gives it, a [B, HQ, L, D] view of [B, L, HQ, D].
                let shape = if token_major { [b, l, hq, d] } else { [b, hq, l, d] };
                let q = arr(&rand_vec((b * hq * l * d) as usize, 92 + prev as u64), &shape)
                    .multiply(&Array::scalar_f32(3.0, Dtype::Float32).unwrap())
                    .unwrap()
                    .astype(dtype)
                    .unwrap();
                mlex::mlx::eval(&[&q, &k, &v]).unwrap();
                let q = if token_major { q.transpose(&[0, 2, 1, 3]).unwrap() } else { q };
                let scale = 1.0 / (d as f32).sqrt();
                let Some(got) = fast::cuda_short_attention(&q, &k, &v, scale, prev as usize, token_major, false).unwrap() else {
                    assert!(!cuda, "{what}: the kernel applies on CUDA");
                    continue;
                };
                let census = mlex::mlx::graph_census(&[&got]).unwrap();
                let kernels: usize = census.iter().filter(|(p, _)| is_our_cuda_kernel(p)).map(|(_, c)| c).sum();
                assert_eq!(kernels, 1, "{what}: one kernel: {census:?}");
                let (kp, vp) = (k.slice_axis(2, 0, prev + l).unwrap(), v.slice_axis(2, 0, prev + l).unwrap());
                let want = fast::scaled_dot_product_attention(&q, &kp, &vp, scale, fast::AttentionMask::Causal).unwrap();
                assert_eq!(got.shape(), want.shape(), "{what}");
                let g = got.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                let w = want.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
                // Float32: MLX's reference multiplies in TF32 on CUDA unless MLX_ENABLE_TF32=0.
                let tol = if dtype == Dtype::Float32 { 1e-3 } else { 1.0 / 64.0 };
                for (i, (a, c)) in g.iter().zip(&w).enumerate() {
                    assert!((a - c).abs() <= tol * (1.0 + c.abs()), "{what}: element {i}: {a} vs {c}");
                }
            }
        }
    }
}

#[test]
fn cuda_gated_delta_kernel_matches_ops_reference() {
    use mlex::mlx::{gpu_available, set_default_device, Device};
    use mlex::nn::gated_delta::{gated_delta_ops, gated_delta_update, gates, normalize_qk};
    if !gpu_available() || cfg!(target_os = "macos") {
        eprintln!("no CUDA GPU: skipped");
        return;
    }
    set_default_device(Device::Gpu).unwrap();
    for t in [1i32, 37] {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let x = delta_inputs(t, dtype);
            let (y, s) = gated_delta_update(&x.q, &x.k, &x.v, &x.a, &x.b, &x.a_log, &x.dt_bias, &x.state).unwrap();
            let what = format!("T={t} {dtype:?}");
            uses_our_cuda_kernel(&[&y, &s], &what);
            let (q, k) = normalize_qk(&x.q, &x.k).unwrap();
            let (g, beta) = gates(&x.a, &x.b, &x.a_log, &x.dt_bias).unwrap();
            let (yr, sr) = gated_delta_ops(&q, &k, &x.v, &g, &beta, &x.state).unwrap();
            let tol = if dtype == Dtype::Float32 { 1e-4 } else { 2e-2 };
            within(&format!("{what} y"), &y, &yr, tol);
            within(&format!("{what} state"), &s, &sr, tol);
        }
    }
}

/// Continuous batching's two ops: rope with each batch row at its own position, and attention
/// over a left-padded batch (row b sees no key before key_start[b]), each equal to the same row
/// computed alone. On the CPU they run our kernels; elsewhere MLX's rope with an offset array
/// and its attention with a boolean mask.
#[test]
fn batched_rope_and_padded_attention_equal_each_row_alone() {
    let row = |a: &Array, b: i32| a.slice_axis(0, b, b + 1).unwrap();
    let offsets = [0i32, 5, 17];
    let offs = Array::from_slice(&offsets, &[3]).unwrap();
    for l in [1i32, 3] {
        let x = arr(&rand_vec((3 * 2 * l * 16) as usize, 90 + l as u64), &[3, 2, l, 16]);
        let freqs = arr(&(0..6).map(|i| 1.0 + i as f32 * 3.0).collect::<Vec<_>>(), &[6]);
        for (dims, f) in [(16, None), (12, Some(&freqs))] {
            let got = fast::rope_offsets(&x, dims, false, 10000.0, 1.0, &offs, f).unwrap();
            for (b, &o) in offsets.iter().enumerate() {
                let want = fast::rope(&row(&x, b as i32), dims, false, 10000.0, 1.0, o, f).unwrap();
                within(&format!("rope row {b}, L {l}, dims {dims}"), &row(&got, b as i32), &want, 1e-6);
            }
        }
    }
    // Each row holds at least its own L new keys (a row never has fewer).
    let starts = [0i32, 3, 7];
    let key_start = Array::from_slice(&starts, &[3]).unwrap();
    let s = 10;
    for (l, causal) in [(1i32, false), (3, true)] {
        let q = arr(&rand_vec((3 * 4 * l * 8) as usize, 95), &[3, 4, l, 8]);
        let k = arr(&rand_vec((3 * 2 * s * 8) as usize, 96), &[3, 2, s, 8]);
        let v = arr(&rand_vec((3 * 2 * s * 8) as usize, 97), &[3, 2, s, 8]);
        let got = fast::scaled_dot_product_attention_padded(&q, &k, &v, 0.35, causal, &key_start).unwrap();
        for (b, &st) in starts.iter().enumerate() {
            let (bq, bk, bv) = (row(&q, b as i32), row(&k, b as i32), row(&v, b as i32));
            let (bk, bv) = (bk.slice_axis(2, st, s).unwrap(), bv.slice_axis(2, st, s).unwrap());
            let mask = if causal { fast::AttentionMask::Causal } else { fast::AttentionMask::None };
            let want = fast::scaled_dot_product_attention(&bq, &bk, &bv, 0.35, mask).unwrap();
            within(&format!("attention row {b}, L {l}"), &row(&got, b as i32), &want, 1e-5);
        }
    }
}

/// A CPU decode step's attention block as one kernel (`fast::cpu_decode_attention`) against the
/// separate ops the model runs without it (per-head norms, rope, the cache writes, attention over
/// the cache's prefix): the same output and the same buffers, bit for bit. Cases: plain, q/k norms,
/// rows at their own positions with left padding (a continuous batch), a traditional and a
/// partial rotation with explicit frequencies, no rotation, head widths 64/128 (AVX-512 rows) and
/// 80 (the portable row).
#[test]
fn cpu_decode_attention_equals_the_separate_ops() {
    use mlex::mlx::fast::{AttentionMask, DecodeRows};
    struct Case {
        name: &'static str,
        b: i32,
        hq: i32,
        hkv: i32,
        d: i32,
        norms: bool,
        batch: bool,
        rope: Option<(i32, bool, bool)>, // dims, traditional, explicit freqs
    }
    let cases = [
        Case { name: "plain", b: 1, hq: 9, hkv: 3, d: 64, norms: false, batch: false, rope: Some((64, false, false)) },
        Case { name: "q/k norms", b: 1, hq: 8, hkv: 2, d: 128, norms: true, batch: false, rope: Some((128, false, false)) },
        Case { name: "batch rows", b: 3, hq: 4, hkv: 2, d: 64, norms: true, batch: true, rope: Some((64, false, false)) },
        Case { name: "traditional, partial, freqs", b: 2, hq: 4, hkv: 4, d: 80, norms: false, batch: true, rope: Some((48, true, true)) },
        Case { name: "no rope", b: 1, hq: 2, hkv: 1, d: 64, norms: false, batch: false, rope: None },
    ];
    for c in &cases {
        let (b, hq, hkv, d) = (c.b, c.hq, c.hkv, c.d);
        let (cap, col) = (32i32, 19i32);
        let w = (hq + 2 * hkv) * d;
        let qkv = arr(&rand_vec((b * w) as usize, 7), &[b, 1, w]);
        let kb = arr(&rand_vec((b * hkv * cap * d) as usize, 8), &[b, hkv, cap, d]);
        let vb = arr(&rand_vec((b * hkv * cap * d) as usize, 9), &[b, hkv, cap, d]);
        let qn = arr(&rand_vec(d as usize, 10).iter().map(|x| 1.0 + 0.5 * x).collect::<Vec<_>>(), &[d]);
        let kn = arr(&rand_vec(d as usize, 11).iter().map(|x| 1.0 + 0.5 * x).collect::<Vec<_>>(), &[d]);
        let positions = Array::from_slice(&(0..b).map(|r| col - 2 * r).collect::<Vec<i32>>(), &[b]).unwrap();
        let key_start = Array::from_slice(&(0..b).map(|r| 2 * r).collect::<Vec<i32>>(), &[b]).unwrap();
        let freqs = c.rope.map(|(dims, _, _)| arr(&(0..dims / 2).map(|i| 10000f32.powf(2.0 * i as f32 / dims as f32) * 1.5).collect::<Vec<_>>(), &[dims / 2]));
        mlex::mlx::eval(&[&qkv, &kb, &vb, &qn, &kn, &positions, &key_start]).unwrap();
        let scale = 1.0 / (d as f32).sqrt();
        let (base, rscale) = (10000.0f32, 0.75f32);
        let explicit = c.rope.is_some_and(|(_, _, f)| f);
        let freqs_used = if explicit { freqs.as_ref() } else { None };

        // The separate ops.
        let heads = qkv.reshape(&[b, hq + 2 * hkv, 1, d]).unwrap().split_at(&[hq, hq + hkv], 1).unwrap();
        let (mut q, mut k, v) = (heads[0].clone(), heads[1].clone(), heads[2].clone());
        if c.norms {
            q = fast::rms_norm(&q, Some(&qn), 1e-6).unwrap();
            k = fast::rms_norm(&k, Some(&kn), 1e-6).unwrap();
        }
        if let Some((dims, trad, _)) = c.rope {
            let rot = |x: &Array| {
                if c.batch {
                    fast::rope_offsets(x, dims, trad, base, rscale, &positions, freqs_used).unwrap()
                } else {
                    fast::rope(x, dims, trad, base, rscale, col, freqs_used).unwrap()
                }
            };
            q = rot(&q);
            k = rot(&k);
        }
        let k2 = kb.slice_update(&k, &[0, 0, col, 0], &[b, hkv, col + 1, d]).unwrap();
        let v2 = vb.slice_update(&v, &[0, 0, col, 0], &[b, hkv, col + 1, d]).unwrap();
        let (kv, vv) = (k2.slice_axis(2, 0, col + 1).unwrap(), v2.slice_axis(2, 0, col + 1).unwrap());
        let o = if c.batch {
            fast::scaled_dot_product_attention_padded(&q, &kv, &vv, scale, false, &key_start).unwrap()
        } else {
            fast::scaled_dot_product_attention(&q, &kv, &vv, scale, AttentionMask::None).unwrap()
        };
        let want = [o.reshape(&[b, 1, -1]).unwrap(), k2, v2];

        // One kernel.
        let rows = DecodeRows {
            column: col as usize,
            positions: c.batch.then_some(&positions),
            key_start: c.batch.then_some(&key_start),
        };
        let norms = c.norms.then_some((&qn, &kn, 1e-6f32));
        let rope = c.rope.map(|(dims, trad, _)| (dims, trad, base, rscale, freqs_used));
        let (o, k2, v2) = fast::cpu_decode_attention(&qkv, &kb, &vb, &rows, (hq, hkv), scale, norms, rope).unwrap().expect("applies on the CPU");
        assert_eq!(mlex::mlx::graph_census(&[&o]).unwrap(), vec![("CpuDecodeAttention".to_string(), 1)], "{}", c.name);
        for (what, got, want) in [("output", &o, &want[0]), ("keys", &k2, &want[1]), ("values", &v2, &want[2])] {
            assert_eq!(got.shape(), want.shape(), "{} {what}", c.name);
            let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
            for (i, (x, y)) in g.iter().zip(&w).enumerate() {
                assert!(x.to_bits() == y.to_bits(), "{} {what}: element {i}: {x} vs {y}", c.name);
            }
        }
    }
}

/// The kernel writes the cache's buffers in place when the cache held their only reference: a
/// step over a 4 MiB buffer allocates no second one.
#[test]
fn cpu_decode_attention_writes_the_buffers_in_place() {
    use mlex::mlx::fast::DecodeRows;
    let (hq, hkv, d, cap) = (4i32, 2i32, 64i32, 8192i32);
    let bytes = (hkv * cap * d * 4) as usize;
    let mut kb = Array::zeros(&[1, hkv, cap, d], Dtype::Float32).unwrap().add(&Array::scalar_f32(0.5, Dtype::Float32).unwrap()).unwrap();
    let mut vb = kb.multiply(&Array::scalar_f32(2.0, Dtype::Float32).unwrap()).unwrap();
    mlex::mlx::eval(&[&kb, &vb]).unwrap();
    for step in 0..3usize {
        let qkv = arr(&rand_vec(((hq + 2 * hkv) * d) as usize, 20 + step as u64), &[1, 1, (hq + 2 * hkv) * d]);
        mlex::mlx::eval(&[&qkv]).unwrap();
        let rows = DecodeRows { column: 100 + step, positions: None, key_start: None };
        let (o, k2, v2) = fast::cpu_decode_attention(&qkv, &kb, &vb, &rows, (hq, hkv), 0.125, None, Some((d, false, 10000.0, 1.0, None)))
            .unwrap()
            .unwrap();
        (kb, vb) = (k2, v2);
        mlex::mlx::reset_peak_memory();
        let before = mlex::mlx::memory_stats().active;
        mlex::mlx::eval(&[&o, &kb, &vb]).unwrap();
        let grew = mlex::mlx::memory_stats().peak.saturating_sub(before);
        assert!(grew < bytes, "step {step}: the step allocated {grew} bytes (a buffer is {bytes})");
    }
}

/// On CUDA, a decode step's q/k/v straight into the cache in one kernel (`cuda_qkv_into_cache`)
/// against MLX's ops (q/k norms or none, rope at one position or one per row, then the cache
/// writes): q and the written column within two roundings of 16-bit values, every other column
/// unchanged to the bit, the buffers written in place (the caller's arrays), and a reader of the
/// buffers that depends on q (our attention) sees the new column. Off CUDA it does not apply.
#[test]
fn cuda_qkv_into_cache_matches_the_separate_ops() {
    use mlex::mlx::fast::AttentionMask;
    use mlex::mlx::{gpu_available, set_default_device, Device};
    let cuda = gpu_available() && !cfg!(target_os = "macos");
    let (hq, hkv, cap) = (4i32, 2i32, 256i32);
    let f32s = |a: &Array| a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
    if !cuda {
        let qkv = arr(&rand_vec(((hq + 2 * hkv) * 64) as usize, 1), &[1, hq + 2 * hkv, 1, 64]).astype(Dtype::Bfloat16).unwrap();
        let kc = Array::zeros(&[1, hkv, cap, 64], Dtype::Bfloat16).unwrap();
        let at = Array::from_slice(&[3i32, cap], &[2]).unwrap();
        let pos = Array::from_slice(&[3i32], &[1]).unwrap();
        let got = fast::cuda_qkv_into_cache(&qkv, (hq, hkv), None, (false, 1e4, 1.0, None), &pos, &at, &kc, &kc).unwrap();
        assert!(got.is_none(), "not CUDA: the kernel does not apply");
        let got = fast::cuda_decode_attention(&qkv, (hq, hkv), None, (false, 1e4, 1.0, None), &pos, &at, &kc, &kc, 0.125).unwrap();
        assert!(got.is_none(), "not CUDA: the fused kernel does not apply");
        return;
    }
    set_default_device(Device::Gpu).unwrap();
    for d in [64i32, 128] {
        for &dtype in &[Dtype::Bfloat16, Dtype::Float16] {
            for b in [1i32, 3] {
                for norm in [true, false] {
                    let slot = 37 + d;
                    let what = format!("d {d} {dtype:?} b {b} norm {norm}");
                    let seed = (d + b) as u64;
                    let qkv = arr(&rand_vec((b * (hq + 2 * hkv) * d) as usize, seed), &[b, hq + 2 * hkv, 1, d])
                        .multiply(&Array::scalar_f32(4.0, Dtype::Float32).unwrap())
                        .unwrap()
                        .astype(dtype)
                        .unwrap();
                    let one = Array::scalar_f32(1.0, Dtype::Float32).unwrap();
                    let qn = arr(&rand_vec(d as usize, 72), &[d]).add(&one).unwrap().astype(dtype).unwrap();
                    let kn = arr(&rand_vec(d as usize, 73), &[d]).add(&one).unwrap().astype(dtype).unwrap();
                    let cache = |s: u64| arr(&rand_vec((b * hkv * cap * d) as usize, s), &[b, hkv, cap, d]).astype(dtype).unwrap();
                    let (kc, vc) = (cache(seed + 1), cache(seed + 2));
                    let at = Array::from_slice(&[slot, cap], &[2]).unwrap();
                    // Rows of a batch at their own positions (b > 1), or all at the column.
                    let pos_v: Vec<i32> = (0..b).map(|r| slot - 5 * r).collect();
                    let pos = Array::from_slice(&pos_v, &[b]).unwrap();
                    mlex::mlx::eval(&[&qkv, &qn, &kn, &kc, &vc, &at, &pos]).unwrap();
                    let (k_before, v_before) = (f32s(&kc), f32s(&vc));
                    let parts = qkv.split_at(&[hq, hq + hkv], 1).unwrap();
                    let prep = |x: &Array, w: &Array| -> Array {
                        let x = if norm { fast::rms_norm(x, Some(w), 1e-6).unwrap() } else { x.clone() };
                        fast::rope_offsets(&x, d, false, 1e6, 1.0, &pos, None).unwrap()
                    };
                    let (want_q, want_k, want_v) = (prep(&parts[0], &qn), prep(&parts[1], &kn), parts[2].clone());
                    // The reference attention over the prefix with the new column.
                    let upd = |c: &Array, x: &Array| c.slice_update(x, &[0, 0, slot, 0], &[b, hkv, slot + 1, d]).unwrap().slice_axis(2, 0, slot + 1).unwrap();
                    let want_o = fast::scaled_dot_product_attention(&want_q, &upd(&kc, &want_k), &upd(&vc, &want_v), 0.125, AttentionMask::None).unwrap();
                    let (want_q, want_k, want_v, want_o) = (f32s(&want_q), f32s(&want_k), f32s(&want_v), f32s(&want_o));
                    let norms = if norm { Some((&qn, &kn, 1e-6f32)) } else { None };
                    // Half the cases as the decode step runs them: the product as it comes
                    // ([B, 1, (HQ + 2·HKV)·D]) and the attention out flat ([B, 1, HQ·D]).
                    let flat = !norm;
                    let input = if flat { qkv.reshape(&[b, 1, (hq + 2 * hkv) * d]).unwrap() } else { qkv.clone() };
                    let q = fast::cuda_qkv_into_cache(&input, (hq, hkv), norms, (false, 1e6, 1.0, None), &pos, &at, &kc, &vc)
                        .unwrap()
                        .expect("applies on CUDA");
                    let census = mlex::mlx::graph_census(&[&q]).unwrap();
                    let kernels: usize = census.iter().filter(|(p, _)| is_our_cuda_kernel(p)).map(|(_, c)| c).sum();
                    assert_eq!(kernels, 1, "{what}: one kernel: {census:?}");
                    let o = fast::cuda_short_attention(&q, &kc, &vc, 0.125, slot as usize, false, flat).unwrap().expect("our attention");
                    assert_eq!(o.shape(), if flat { vec![b, 1, hq * d] } else { vec![b, hq, 1, d] }, "{what}");
                    mlex::mlx::eval(&[&o]).unwrap();
                    let row = d as usize;
                    for (name, got, before, want) in [("k", f32s(&kc), &k_before, &want_k), ("v", f32s(&vc), &v_before, &want_v)] {
                        for bh in 0..(b * hkv) as usize {
                            for tok in 0..cap as usize {
                                let at = (bh * cap as usize + tok) * row;
                                let g = &got[at..at + row];
                                if tok != slot as usize {
                                    assert!(g == &before[at..at + row], "{what}: {name} column {tok} of head {bh} changed");
                                    continue;
                                }
                                let w = &want[bh * row..(bh + 1) * row];
                                for (i, (a, c)) in g.iter().zip(w).enumerate() {
                                    let tol = if name == "v" { 0.0 } else { c.abs() / 64.0 + 4.0 / 256.0 };
                                    assert!((a - c).abs() <= tol, "{what} {name}: head {bh} element {i}: {a} vs {c}");
                                }
                            }
                        }
                    }
                    for (i, (a, c)) in f32s(&q).iter().zip(&want_q).enumerate() {
                        assert!((a - c).abs() <= c.abs() / 64.0 + 4.0 / 256.0, "{what} q: element {i}: {a} vs {c}");
                    }
                    for (i, (a, c)) in f32s(&o).iter().zip(&want_o).enumerate() {
                        assert!((a - c).abs() <= c.abs() / 32.0 + 8.0 / 256.0, "{what} attention: element {i}: {a} vs {c}");
                    }
                    // The write and the attention as one kernel: the two kernels' output bit for
                    // bit (it writes the same column again, with the same bits).
                    let (k_mid, v_mid) = (f32s(&kc), f32s(&vc));
                    let fused = fast::cuda_decode_attention(&input, (hq, hkv), norms, (false, 1e6, 1.0, None), &pos, &at, &kc, &vc, 0.125)
                        .unwrap()
                        .expect("the fused kernel applies on CUDA");
                    let census = mlex::mlx::graph_census(&[&fused]).unwrap();
                    let kernels: usize = census.iter().filter(|(p, _)| is_our_cuda_kernel(p)).map(|(_, c)| c).sum();
                    assert_eq!(kernels, 1, "{what}: one kernel: {census:?}");
                    assert_eq!(fused.shape(), vec![b, 1, hq * d], "{what}");
                    let (f, g) = (f32s(&fused), f32s(&o));
                    for (i, (a, c)) in f.iter().zip(&g).enumerate() {
                        assert!(a.to_bits() == c.to_bits(), "{what} fused attention: element {i}: {a} vs {c}");
                    }
                    assert!(f32s(&kc) == k_mid && f32s(&vc) == v_mid, "{what}: the fused kernel wrote other bits into the cache");
                }
            }
        }
    }
}

/// MLX's `gelu_approx` as one compiled kernel (`fast::gelu_approx`; a vision tower's MLP uses it
/// on a GPU: `nn::activation::gelu_approx`) against the same expression as separate operations
/// and against the formula in f64, float32 and bfloat16, on the GPU when there is one (the
/// compiled kernel must then be what runs), else on the CPU.
#[test]
fn cuda_gelu_approx_compiled_matches_its_operations() {
    use mlex::mlx::{gpu_available, set_default_device, Device};
    use mlex::nn::activation::{gelu_approx, gelu_approx_ops};
    let gpu = gpu_available() && !cfg!(target_os = "macos");
    set_default_device(if gpu { Device::Gpu } else { Device::Cpu }).unwrap();
    let x: Vec<f32> = rand_vec(4096, 91).iter().map(|v| v * 6.0).collect();
    let want: Vec<f32> = x
        .iter()
        .map(|&v| {
            let v = v as f64;
            (0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())) as f32
        })
        .collect();
    for (dtype, tol) in [(Dtype::Float32, 1e-5f32), (Dtype::Bfloat16, 3e-2)] {
        let xa = arr(&x, &[8, 512]).astype(dtype).unwrap();
        let compiled = fast::gelu_approx(&xa).unwrap();
        let ops = gelu_approx_ops(&xa).unwrap();
        let layer = gelu_approx(&xa).unwrap();
        // Before anything is evaluated (an evaluated array has no graph left to count).
        let census = mlex::mlx::graph_census(&[&layer]).unwrap();
        assert_eq!(census.iter().any(|(p, _)| p.starts_with("Compiled")), gpu, "{census:?}");
        let f32s = |a: &Array| a.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        let (c, o, l) = (f32s(&compiled), f32s(&ops), f32s(&layer));
        close(&c, &want, tol);
        close(&o, &want, tol);
        // In float32 the compiled kernel and the operations differ at most by the roundings of
        // contracted multiply-adds (bfloat16: each against the formula above).
        if dtype == Dtype::Float32 {
            close(&c, &o, 2e-6);
        }
        if gpu {
            assert!(c.iter().zip(&l).all(|(a, b)| a.to_bits() == b.to_bits()));
        } else {
            assert!(o.iter().zip(&l).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
    set_default_device(Device::Cpu).unwrap();
}
