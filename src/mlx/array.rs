//! The RAII handle for an MLX array.
use super::dtype::{Dtype, Element};
use super::error::check;
use super::sys;
use crate::error::{Error, Result};
use std::os::raw::{c_int, c_void};

/// An MLX array: a lazily evaluated node of MLX's compute graph.
///
/// Dropping it releases MLX's reference. `Send` so arrays can move to the engine thread, but not
/// `Sync`: MLX is not thread-safe, and one engine thread owns every array (DESIGN.md §2).
pub struct Array {
    raw: sys::mlex_array,
}

// SAFETY: an array handle is a heap-allocated shared_ptr wrapper with no thread affinity; moving it
// is safe. Concurrent use is not (no Sync), and mlex only touches arrays from its engine thread.
unsafe impl Send for Array {}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: raw came from the shim and is freed exactly once.
        unsafe { sys::mlex_array_free(self.raw) }
    }
}

impl Clone for Array {
    /// Another handle to the same graph node (no data copy).
    fn clone(&self) -> Self {
        Array::try_from_op(|out| unsafe { sys::mlex_array_clone(self.raw, out) })
            .expect("cloning an MLX array handle cannot fail")
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array({:?}, {:?})", self.shape(), self.dtype())
    }
}

/// Lets MLX keep memory owned by Rust alive (an mmap, a Vec) until it no longer needs it.
struct Keepalive(#[allow(dead_code)] /* held only for its Drop */ Box<dyn std::any::Any + Send>);

unsafe extern "C" fn release_keepalive(ctx: *mut c_void) {
    // SAFETY: ctx is the Box<Keepalive> leaked in from_owned_bytes; MLX calls this exactly once.
    drop(unsafe { Box::from_raw(ctx as *mut Keepalive) });
}

impl Array {
    /// Runs a shim call that writes one array into `out`.
    pub(crate) fn try_from_op(f: impl FnOnce(*mut sys::mlex_array) -> c_int) -> Result<Array> {
        let mut raw: sys::mlex_array = std::ptr::null_mut();
        check(f(&mut raw))?;
        debug_assert!(!raw.is_null());
        Ok(Array { raw })
    }

    /// Takes ownership of a handle the shim just returned successfully.
    pub(crate) fn from_raw(raw: sys::mlex_array) -> Array {
        debug_assert!(!raw.is_null());
        Array { raw }
    }

    pub(crate) fn raw(&self) -> sys::mlex_array {
        self.raw
    }

    /// Copies `data` into a new array of `shape`.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let n: i64 = shape.iter().map(|&d| d as i64).product();
        if n != data.len() as i64 || shape.iter().any(|&d| d < 0) {
            return Err(Error::InvalidArgument(format!(
                "array of {} elements cannot have shape {shape:?}",
                data.len()
            )));
        }
        Array::try_from_op(|out| unsafe {
            sys::mlex_array_from_copy(
                data.as_ptr() as *const c_void,
                shape.as_ptr(),
                shape.len(),
                T::DTYPE.to_sys(),
                out,
            )
        })
    }

    /// Wraps bytes owned by `owner` (e.g. a memory map) without copying where MLX allows it; MLX
    /// drops `owner` once it no longer reads the bytes. `bytes` must point into memory `owner` keeps alive.
    pub fn from_owned_bytes(
        bytes: &[u8],
        shape: &[i32],
        dtype: Dtype,
        owner: Box<dyn std::any::Any + Send>,
    ) -> Result<Array> {
        let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
        if n * dtype.size() != bytes.len() {
            return Err(Error::InvalidArgument(format!(
                "{} bytes cannot hold a {} array of shape {shape:?}",
                bytes.len(),
                dtype.name()
            )));
        }
        let ctx = Box::into_raw(Box::new(Keepalive(owner))) as *mut c_void;
        let res = Array::try_from_op(|out| unsafe {
            sys::mlex_array_from_data(
                bytes.as_ptr() as *mut c_void,
                shape.as_ptr(),
                shape.len(),
                dtype.to_sys(),
                Some(release_keepalive),
                ctx,
                out,
            )
        });
        res
    }

    pub fn scalar_f32(v: f32, dtype: Dtype) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_array_scalar_f32(v, dtype.to_sys(), out) })
    }

    pub fn scalar_i32(v: i32, dtype: Dtype) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_array_scalar_i32(v, dtype.to_sys(), out) })
    }

    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_zeros(shape.as_ptr(), shape.len(), dtype.to_sys(), out) })
    }

    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_ones(shape.as_ptr(), shape.len(), dtype.to_sys(), out) })
    }

    pub fn full(shape: &[i32], v: f32, dtype: Dtype) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_full(shape.as_ptr(), shape.len(), v, dtype.to_sys(), out) })
    }

    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        Array::try_from_op(|out| unsafe { sys::mlex_arange(start, stop, step, dtype.to_sys(), out) })
    }

    pub fn ndim(&self) -> usize {
        let mut n = 0usize;
        check(unsafe { sys::mlex_array_ndim(self.raw, &mut n) }).expect("ndim of a valid array");
        n
    }

    pub fn shape(&self) -> Vec<i32> {
        let mut s = vec![0i32; self.ndim()];
        check(unsafe { sys::mlex_array_shape(self.raw, s.as_mut_ptr(), s.len()) }).expect("shape of a valid array");
        s
    }

    /// Size of axis `axis` (negative counts from the end).
    pub fn dim(&self, axis: i32) -> i32 {
        let s = self.shape();
        let i = if axis < 0 { s.len() as i32 + axis } else { axis };
        s[i as usize]
    }

    pub fn dtype(&self) -> Dtype {
        let mut d: sys::mlex_dtype = 0;
        check(unsafe { sys::mlex_array_dtype(self.raw, &mut d) }).expect("dtype of a valid array");
        Dtype::from_sys(d)
    }

    pub fn size(&self) -> usize {
        let mut n = 0usize;
        check(unsafe { sys::mlex_array_size(self.raw, &mut n) }).expect("size of a valid array");
        n
    }

    pub fn nbytes(&self) -> usize {
        let mut n = 0usize;
        check(unsafe { sys::mlex_array_nbytes(self.raw, &mut n) }).expect("nbytes of a valid array");
        n
    }

    /// Evaluates the array and copies it out as `T` (converting the dtype if needed).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let n = self.size();
        let mut v = vec![T::default(); n];
        check(unsafe {
            sys::mlex_array_read(
                self.raw,
                T::DTYPE.to_sys(),
                v.as_mut_ptr() as *mut c_void,
                n * std::mem::size_of::<T>(),
            )
        })?;
        Ok(v)
    }

    /// Evaluates the array and copies out its bytes as they are (its own dtype, row-major).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let n = self.nbytes();
        let mut v = vec![0u8; n];
        check(unsafe { sys::mlex_array_read(self.raw, self.dtype().to_sys(), v.as_mut_ptr() as *mut c_void, n) })?;
        Ok(v)
    }

    /// The single element of a size-1 array as f32.
    pub fn item_f32(&self) -> Result<f32> {
        let v = self.to_vec::<f32>()?;
        v.first().copied().ok_or_else(|| Error::Mlx("item() of an empty array".into()))
    }

    pub fn item_i32(&self) -> Result<i32> {
        let v = self.to_vec::<i32>()?;
        v.first().copied().ok_or_else(|| Error::Mlx("item() of an empty array".into()))
    }

    /// Evaluates this array now.
    pub fn eval(&self) -> Result<()> {
        eval(&[self])
    }
}

/// Evaluates the arrays (and everything they depend on), blocking until done.
pub fn eval(arrays: &[&Array]) -> Result<()> {
    let raws: Vec<sys::mlex_array> = arrays.iter().map(|a| a.raw).collect();
    check(unsafe { sys::mlex_eval(raws.as_ptr(), raws.len()) })
}

/// Moves the CUDA managed-memory buffers of `arrays` (evaluated) into device memory, waiting for
/// the copy: the bytes moved (0 off CUDA). Arrays made from host data, such as weights read from a
/// file, live in managed memory, whose pages otherwise migrate page fault by page fault on the
/// GPU's first touch, inside the first request.
pub fn prefetch_to_device(arrays: &[&Array]) -> Result<u64> {
    let raws: Vec<sys::mlex_array> = arrays.iter().map(|a| a.raw).collect();
    let mut bytes = 0u64;
    check(unsafe { sys::mlex_cuda_prefetch(raws.as_ptr(), raws.len(), &mut bytes) })?;
    Ok(bytes)
}

/// The not-yet-evaluated operations behind `arrays`, counted by MLX primitive name (most
/// frequent first): what one evaluation will dispatch, for profiling graph size.
pub fn graph_census(arrays: &[&Array]) -> Result<Vec<(String, usize)>> {
    let raws: Vec<sys::mlex_array> = arrays.iter().map(|a| a.raw).collect();
    let mut out: *const std::os::raw::c_char = std::ptr::null();
    check(unsafe { sys::mlex_graph_census(raws.as_ptr(), raws.len(), &mut out) })?;
    // SAFETY: on success the shim points `out` at a NUL-terminated thread-local string.
    let text = unsafe { std::ffi::CStr::from_ptr(out) }.to_string_lossy().into_owned();
    Ok(text
        .lines()
        .filter_map(|l| l.rsplit_once(' ').and_then(|(n, c)| Some((n.to_string(), c.parse().ok()?))))
        .collect())
}

/// Schedules evaluation and returns at once; a later `eval`/read waits for it.
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    let raws: Vec<sys::mlex_array> = arrays.iter().map(|a| a.raw).collect();
    check(unsafe { sys::mlex_async_eval(raws.as_ptr(), raws.len()) })
}
