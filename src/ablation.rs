//! Benchmark ablations (BENCHMARKS.md): switches that turn one of mlex's optimisations off so a
//! benchmark can show what it buys. They are read from the environment once, here, into one
//! struct; model and kernel code ask [`get`] instead of reading the environment themselves, and
//! the C++ kernels receive their switches through `mlex_set_ablations` on the first call.
//!
//! | variable | turns off |
//! |---|---|
//! | `MLEX_ABLATE_FUSION=qkv\|gate_up\|all` | fused projections (that group, or both) |
//! | `MLEX_ABLATE_PREFILL_BOUND` | the bound on layers in flight during prefill |
//! | `MLEX_ABLATE_PIPELINING` | building the next decode step before the token is read |
//! | `MLEX_ABLATE_FIRST_TOKEN_EARLY` | handing a request's first token over before its next step is built (built first instead, as for every later token) |
//! | `MLEX_ABLATE_SPEC_PIPELINE` | building the next prompt-lookup pass before this one is read |
//! | `MLEX_ABLATE_CPU_QMM` | our CPU quantized matmul |
//! | `MLEX_ABLATE_CPU_GEMM` | its packed GEMM for prompt chunks (the row kernels instead) |
//! | `MLEX_ABLATE_CPU_DENSE_ROWS` | our CPU product of up to 32 rows with a float32 weight (MLX's matmul, the bundled reference BLAS, instead) |
//! | `MLEX_ABLATE_CPU_PACK_Q4` | that GEMM's AVX-512 dequantization of 4-bit weights (the general one instead; same bits) |
//! | `MLEX_ABLATE_CPU_FAST_OPS` | our CPU RMSNorm / RoPE / attention |
//! | `MLEX_ABLATE_CUDA_QMV` | our CUDA decode matrix-vector kernel |
//! | `MLEX_ABLATE_CUDA_EPILOGUE` | the residual add and SwiGLU folded into that kernel |
//! | `MLEX_ABLATE_CUDA_NORM_FOLD` | a layer's pre-norm (RMSNorm) folded into that kernel |
//! | `MLEX_ABLATE_CPU_NORM_FOLD` | a layer's pre-norm folded into our CPU quantized matmul |
//! | `MLEX_ABLATE_CPU_EPILOGUE` | the residual add and SwiGLU folded into our CPU quantized matmul |
//! | `MLEX_ABLATE_CUDA_KV_WRITE` | a CUDA decode step's q/k/v written into the cache by one kernel of ours (our q/k kernel or MLX's ropes, then MLX's cache writes) |
//! | `MLEX_ABLATE_CPU_DECODE_ATTN` | a CPU decode step's attention block as one kernel (the separate rope, cache writes and attention instead) |
//! | `MLEX_ABLATE_CUDA_QK_ROPE` | our CUDA kernel for q/k norms + rope (MLX's four kernels instead) |
//! | `MLEX_ABLATE_CUDA_FUSED_ATTN` | a CUDA decode step's cache write and short-context attention as one kernel (the write kernel, then the attention kernel) |
//! | `MLEX_ABLATE_CUDA_SHORT_ATTN` | our CUDA attention for short passes (MLX's cuDNN under a mask instead) |
//! | `MLEX_ABLATE_GATED_DELTA` | our gated delta kernels (CPU and CUDA) |
//! | `MLEX_ABLATE_CUDA_DEVICE_ALLOC` | device memory for our CUDA kernels' outputs (MLX's managed memory instead) |
//! | `MLEX_ABLATE_PREFILL_OVERLAP` | building a prompt's first step while its last prefill chunk (and its images' encoding) runs: each is waited for |
//! | `MLEX_ABLATE_PROMPT_FOLD` | a prompt's last token in its last prefill chunk (a one-token step of its own after the prefill instead) |
//! | `MLEX_ABLATE_GPU_PREFETCH` | moving the weights into device memory at load (CUDA) |
//! | `MLEX_ABLATE_CUDNN_BUCKETS` | a CUDA prompt chunk's attention over the whole key/value buffers with its queries padded to a bucket (the exact shapes instead: cuDNN compiles a graph per prompt length) |
//! | `MLEX_ABLATE_LOAD_CLEAR_CACHE` | releasing MLX's buffer cache at the end of a load (what loading freed stays cached for the first request) |
use crate::mlx::sys;
use std::sync::OnceLock;

#[derive(Debug, Default)]
pub struct Ablations {
    /// Projection groups kept separate: "qkv", "gate_up", or both for any other value.
    pub fusion: Option<String>,
    pub prefill_bound: bool,
    pub pipelining: bool,
    pub first_token_early: bool,
    pub spec_pipelining: bool,
    pub gpu_prefetch: bool,
    pub prefill_overlap: bool,
    pub prompt_fold: bool,
    pub load_clear_cache: bool,
    pub cudnn_exact_shapes: bool,
    /// The C++ kernels' switches (`MLEX_ABLATE_KERNEL_*` bits of shim.h).
    pub kernels: u32,
}

impl Ablations {
    /// Whether the projection group `kind` ("qkv", "gate_up") stays unfused.
    pub fn unfused(&self, kind: &str) -> bool {
        match self.fusion.as_deref() {
            None => false,
            Some(v @ ("qkv" | "gate_up")) => v == kind,
            Some(_) => true,
        }
    }

    fn from_env() -> Self {
        let on = |name: &str| std::env::var_os(name).is_some();
        let kernels = [
            ("MLEX_ABLATE_CPU_QMM", sys::MLEX_ABLATE_KERNEL_CPU_QMM),
            ("MLEX_ABLATE_CPU_GEMM", sys::MLEX_ABLATE_KERNEL_CPU_GEMM),
            ("MLEX_ABLATE_CPU_PACK_Q4", sys::MLEX_ABLATE_KERNEL_CPU_PACK_Q4),
            ("MLEX_ABLATE_CPU_DENSE_ROWS", sys::MLEX_ABLATE_KERNEL_CPU_DENSE_ROWS),
            ("MLEX_ABLATE_CPU_FAST_OPS", sys::MLEX_ABLATE_KERNEL_CPU_FAST_OPS),
            ("MLEX_ABLATE_CUDA_QMV", sys::MLEX_ABLATE_KERNEL_CUDA_QMV),
            ("MLEX_ABLATE_CUDA_EPILOGUE", sys::MLEX_ABLATE_KERNEL_CUDA_EPILOGUE),
            ("MLEX_ABLATE_GATED_DELTA", sys::MLEX_ABLATE_KERNEL_GATED_DELTA),
            ("MLEX_ABLATE_CUDA_NORM_FOLD", sys::MLEX_ABLATE_KERNEL_CUDA_NORM_FOLD),
            ("MLEX_ABLATE_CUDA_QK_ROPE", sys::MLEX_ABLATE_KERNEL_CUDA_QK_ROPE),
            ("MLEX_ABLATE_CPU_NORM_FOLD", sys::MLEX_ABLATE_KERNEL_CPU_NORM_FOLD),
            ("MLEX_ABLATE_CPU_EPILOGUE", sys::MLEX_ABLATE_KERNEL_CPU_EPILOGUE),
            ("MLEX_ABLATE_CPU_DECODE_ATTN", sys::MLEX_ABLATE_KERNEL_CPU_DECODE_ATTN),
            ("MLEX_ABLATE_CUDA_KV_WRITE", sys::MLEX_ABLATE_KERNEL_CUDA_KV_WRITE),
            ("MLEX_ABLATE_CUDA_SHORT_ATTN", sys::MLEX_ABLATE_KERNEL_CUDA_SHORT_ATTN),
            ("MLEX_ABLATE_CUDA_FUSED_ATTN", sys::MLEX_ABLATE_KERNEL_CUDA_FUSED_ATTN),
            ("MLEX_ABLATE_CUDA_DEVICE_ALLOC", sys::MLEX_ABLATE_KERNEL_CUDA_DEVICE_ALLOC),
        ]
        .iter()
        .filter(|(name, _)| on(name))
        .fold(0u32, |m, (_, bit)| m | *bit);
        Ablations {
            fusion: std::env::var("MLEX_ABLATE_FUSION").ok(),
            prefill_bound: on("MLEX_ABLATE_PREFILL_BOUND"),
            pipelining: on("MLEX_ABLATE_PIPELINING"),
            first_token_early: on("MLEX_ABLATE_FIRST_TOKEN_EARLY"),
            spec_pipelining: on("MLEX_ABLATE_SPEC_PIPELINE"),
            gpu_prefetch: on("MLEX_ABLATE_GPU_PREFETCH"),
            prefill_overlap: on("MLEX_ABLATE_PREFILL_OVERLAP"),
            load_clear_cache: on("MLEX_ABLATE_LOAD_CLEAR_CACHE"),
            cudnn_exact_shapes: on("MLEX_ABLATE_CUDNN_BUCKETS"),
            prompt_fold: on("MLEX_ABLATE_PROMPT_FOLD"),
            kernels,
        }
    }
}

/// The process's ablations (none unless a benchmark set them), read on first use; the engine
/// thread asks before it builds a model, so the kernels know theirs before they first run.
pub fn get() -> &'static Ablations {
    static A: OnceLock<Ablations> = OnceLock::new();
    A.get_or_init(|| {
        let a = Ablations::from_env();
        unsafe { sys::mlex_set_ablations(a.kernels) };
        a
    })
}
