//! Turns the shim's int status + thread-local message into `Result`.
use super::sys;
use crate::error::{Error, Result};
use std::ffi::CStr;
use std::os::raw::c_int;

/// The message MLX left for this thread after a failed shim call.
pub(crate) fn last_error() -> String {
    // SAFETY: the shim returns a pointer into a thread-local std::string, valid until the next call.
    unsafe { CStr::from_ptr(sys::mlex_last_error()) }.to_string_lossy().into_owned()
}

/// Maps a shim status to `Result`, classifying allocation failures as out-of-memory.
pub(crate) fn check(status: c_int) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    let msg = last_error();
    let lower = msg.to_ascii_lowercase();
    if lower.contains("out of memory") || lower.contains("unable to allocate") || lower.contains("bad_alloc")
        || lower.contains("failed to allocate")
    {
        Err(Error::OutOfMemory(msg))
    } else {
        Err(Error::Mlx(msg))
    }
}
