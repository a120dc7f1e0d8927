//! Device selection and memory figures.
use super::error::check;
use super::sys;
use crate::error::Result;
use std::ffi::CStr;

/// Where MLX runs the graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// Metal on macOS, CUDA on Linux builds against the CUDA wheel.
    Gpu,
}

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

/// Whether the loaded libmlx has a GPU backend (and a GPU).
pub fn gpu_available() -> bool {
    let mut ok = false;
    check(unsafe { sys::mlex_gpu_available(&mut ok) }).map(|_| ok).unwrap_or(false)
}

/// Whether ops created on this thread now run on a CUDA GPU (the GPU default on Linux), where
/// some shapes are worth choosing for MLX's CUDA kernels (see `nn::kv_cache`).
pub fn on_cuda() -> bool {
    static GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cfg!(target_os = "linux") && *GPU.get_or_init(gpu_available) && default_device().is_ok_and(|d| d == Device::Gpu)
}

/// Makes `device` the default for ops created on this thread from now on.
pub fn set_default_device(device: Device) -> Result<()> {
    let d = match device {
        Device::Cpu => sys::MLEX_DEVICE_CPU,
        Device::Gpu => sys::MLEX_DEVICE_GPU,
    };
    check(unsafe { sys::mlex_set_default_device(d) })
}

/// Whether the quantized products this thread builds from now on round their activations to 8
/// bits, on CPUs with AVX-512 VNNI ([`crate::LoadOptions::int8_activations`]). Elsewhere, and on
/// the GPU, it changes nothing.
pub fn set_cpu_int8_activations(on: bool) {
    unsafe { sys::mlex_set_cpu_int8_activations(on as std::os::raw::c_int) }
}

/// Whether this CPU runs 8-bit activations (AVX-512 VNNI; see [`set_cpu_int8_activations`]).
pub fn cpu_int8_activations_supported() -> bool {
    unsafe { sys::mlex_cpu_int8_activations_supported() != 0 }
}

pub fn default_device() -> Result<Device> {
    let mut d = sys::MLEX_DEVICE_CPU;
    check(unsafe { sys::mlex_default_device(&mut d) })?;
    Ok(if d == sys::MLEX_DEVICE_GPU { Device::Gpu } else { Device::Cpu })
}

/// MLX's version string, as the loaded libmlx reports it.
pub fn mlx_version() -> String {
    unsafe { CStr::from_ptr(sys::mlex_version()) }.to_string_lossy().into_owned()
}

/// Bytes MLX holds in live arrays, at its peak since the last reset, and in its buffer cache.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryStats {
    pub active: usize,
    pub peak: usize,
    pub cache: usize,
}

pub fn memory_stats() -> MemoryStats {
    let mut m = MemoryStats::default();
    unsafe {
        let _ = sys::mlex_memory_active(&mut m.active);
        let _ = sys::mlex_memory_peak(&mut m.peak);
        let _ = sys::mlex_memory_cache(&mut m.cache);
    }
    m
}

/// Node (`memoryStats()` of the package): MLX's memory figures for the whole process, in bytes.
#[cfg(feature = "node")]
#[napi_derive::napi(object, js_name = "NativeMemoryStats")]
pub struct NodeMemoryStats {
    /// Bytes in live arrays (weights, KV caches, pooled prompt caches, arrays in flight).
    pub active_bytes: f64,
    /// The most `active_bytes` has been (a high-water mark).
    pub peak_bytes: f64,
    /// Freed buffers MLX keeps for reuse.
    pub cache_bytes: f64,
    /// MLX's memory limit (allocations beyond it fail).
    pub limit_bytes: f64,
}

/// Internal: MLX's memory figures (the wrapper's `memoryStats()`).
#[cfg(feature = "node")]
#[napi_derive::napi(js_name = "nativeMemoryStats")]
pub fn node_memory_stats() -> NodeMemoryStats {
    let m = memory_stats();
    NodeMemoryStats {
        active_bytes: m.active as f64,
        peak_bytes: m.peak as f64,
        cache_bytes: m.cache as f64,
        limit_bytes: memory_limit() as f64,
    }
}

/// MLX's memory limit in bytes (allocations beyond it fail).
pub fn memory_limit() -> usize {
    let mut n = 0;
    unsafe {
        let _ = sys::mlex_memory_limit(&mut n);
    }
    n
}

pub fn reset_peak_memory() {
    unsafe {
        let _ = sys::mlex_memory_reset_peak();
    }
}

pub fn clear_cache() {
    unsafe {
        let _ = sys::mlex_memory_clear_cache();
    }
}

/// Sets MLX's memory limit; returns the previous one.
pub fn set_memory_limit(bytes: usize) -> Result<usize> {
    let mut prev = 0;
    check(unsafe { sys::mlex_set_memory_limit(bytes, &mut prev) })?;
    Ok(prev)
}

/// Sets the size of MLX's buffer cache; returns the previous one.
pub fn set_cache_limit(bytes: usize) -> Result<usize> {
    let mut prev = 0;
    check(unsafe { sys::mlex_set_cache_limit(bytes, &mut prev) })?;
    Ok(prev)
}

/// Wired-memory limit (Metal only; a no-op elsewhere).
pub fn set_wired_limit(bytes: usize) -> Result<usize> {
    let mut prev = 0;
    check(unsafe { sys::mlex_set_wired_limit(bytes, &mut prev) })?;
    Ok(prev)
}

/// Waits until every scheduled computation (async_eval) on this thread's streams has finished.
pub fn synchronize() -> Result<()> {
    check(unsafe { sys::mlex_synchronize() })
}
