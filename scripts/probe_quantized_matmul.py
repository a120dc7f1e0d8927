"""Times MLX's quantized matmul kernels at the shapes our models use, to see which dispatch MLX
picks and what it costs (BENCHMARKS.md, "Where decode time goes"). Prints one JSON line per
case: microseconds per call, measured over a batch of independent calls evaluated together so
that host-side launch overhead overlaps the kernels.

  python scripts/probe_quantized_matmul.py            # on whatever device MLX defaults to

Cases:
  rows=1 (decode): one matmul of N outputs vs the same N split into row chunks of <= 16384
    (in case MLX used a tiled GEMM past N, K = 16384 at one row), and a K > 16384
    matmul vs two K halves added;
  rows=511 (prefill): quantized matmul vs dequantize + dense matmul."""
import json
import time

import mlx.core as mx

GROUP, BITS = 64, 4


def per_call_us(fn, iters):
    mx.eval(fn())
    mx.synchronize()
    t = time.perf_counter()
    outs = [fn() for _ in range(iters)]
    mx.eval(outs)
    mx.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def qweight(n, k):
    w = mx.random.normal((n, k), dtype=mx.bfloat16) * 0.02
    q = mx.quantize(w, group_size=GROUP, bits=BITS)
    mx.eval(q)
    return q


def qmm(x, q):
    w, s, b = q
    return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=GROUP, bits=BITS)


def row_chunks(q, n, chunk):
    return [tuple(a[i:i + chunk] for a in q) for i in range(0, n, chunk)]


def report(**kw):
    print(json.dumps(kw), flush=True)


def decode_cases():
    for name, n, k in [("qwen3-0.6b gate_up", 6144, 1024), ("qwen3-0.6b lm_head", 151936, 1024),
                       ("smollm2 lm_head", 49152, 576), ("qwen2.5-7b gate_up", 37888, 3584),
                       ("qwen2.5-7b gate", 18944, 3584), ("qwen2.5-7b lm_head", 152064, 3584),
                       ("llama-3.2-3b lm_head", 128256, 3072)]:
        q = qweight(n, k)
        x = mx.random.normal((1, 1, k), dtype=mx.bfloat16)
        one = per_call_us(lambda: qmm(x, q), 200)
        row = dict(case=name, rows=1, n=n, k=k, one_call_us=round(one, 1))
        if n > 16384:
            parts = (n + 16383) // 16384
            chunk = -(-n // parts // 64) * 64
            cs = row_chunks(q, n, chunk)
            split = per_call_us(lambda: mx.concatenate([qmm(x, c) for c in cs], axis=-1), 200)
            ref = qmm(x, q)
            got = mx.concatenate([qmm(x, c) for c in cs], axis=-1)
            row.update(chunks=len(cs), chunked_us=round(split, 1),
                       max_abs_diff=float(mx.abs(ref.astype(mx.float32) - got.astype(mx.float32)).max()))
        report(**row)
    # K > 16384: qwen2.5-7b down_proj.
    n, k = 3584, 18944
    q = qweight(n, k)
    x = mx.random.normal((1, 1, k), dtype=mx.bfloat16)
    half = k // 2
    w0 = mx.quantize(mx.random.normal((n, half), dtype=mx.bfloat16) * 0.02, group_size=GROUP, bits=BITS)
    w1 = mx.quantize(mx.random.normal((n, half), dtype=mx.bfloat16) * 0.02, group_size=GROUP, bits=BITS)
    mx.eval(w0, w1)
    one = per_call_us(lambda: qmm(x, q), 200)
    split = per_call_us(lambda: qmm(x[..., :half], w0) + qmm(x[..., half:], w1), 200)
    report(case="qwen2.5-7b down_proj", rows=1, n=n, k=k, one_call_us=round(one, 1), k_halves_us=round(split, 1))


def prefill_cases():
    for name, n, k in [("qwen3-0.6b gate_up", 6144, 1024), ("qwen3-0.6b down", 1024, 3072),
                       ("qwen2.5-7b gate_up", 37888, 3584), ("qwen2.5-7b down", 3584, 18944)]:
        q = qweight(n, k)
        x = mx.random.normal((1, 511, k), dtype=mx.bfloat16)
        quant = per_call_us(lambda: qmm(x, q), 20)
        deq = per_call_us(lambda: x @ mx.dequantize(*q, group_size=GROUP, bits=BITS).T, 20)
        report(case=name, rows=511, n=n, k=k, quantized_us=round(quant, 1), dequant_gemm_us=round(deq, 1))


if __name__ == "__main__":
    report(device=str(mx.default_device()), mlx=mx.__version__)
    decode_cases()
    prefill_cases()
