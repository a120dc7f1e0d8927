//! Which BLAS MLX's CPU backend calls (see build.rs, `MLEX_OPENBLAS`).

#[cfg(mlex_openblas)]
extern "C" {
    fn openblas_get_num_threads() -> std::os::raw::c_int;
}

/// "openblas (N threads)" when the build linked OpenBLAS ahead of MLX, else "bundled reference BLAS".
pub fn blas_backend() -> String {
    #[cfg(mlex_openblas)]
    {
        // SAFETY: a plain query of OpenBLAS's thread pool size.
        let n = unsafe { openblas_get_num_threads() };
        format!("openblas ({n} threads)")
    }
    #[cfg(not(mlex_openblas))]
    {
        "bundled reference BLAS".to_string()
    }
}
