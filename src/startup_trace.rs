//! `MLEX_TRACE_STARTUP=1`: the phases from process start to the first token, on stderr.
//!
//! Each [`mark`] prints the milliseconds since the first mark (the CLI marks `main`'s first line;
//! a library host's first mark is its first `Session::load`) and since the previous one. Without
//! the variable a mark costs one relaxed atomic load. Only the first [`MAX_MARKS`] marks print, so
//! that a long-running host (a server, a Node process) started with the variable set is not
//! flooded by the marks of later requests' prefills; a number above 1 as the variable's value
//! (`MLEX_TRACE_STARTUP=500`) prints that many instead, to follow several requests of a benchmark.
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// 0: not yet read, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static CLOCK: OnceLock<Mutex<(Instant, Instant)>> = OnceLock::new();
static PRINTED: AtomicUsize = AtomicUsize::new(0);
static LIMIT: AtomicUsize = AtomicUsize::new(MAX_MARKS);

/// How many marks print at most, per process.
pub const MAX_MARKS: usize = 64;

/// Whether `MLEX_TRACE_STARTUP` is set (to anything but "" or "0").
pub fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let value = std::env::var("MLEX_TRACE_STARTUP").unwrap_or_default();
            let on = !value.is_empty() && value != "0";
            if let Ok(n @ 2..) = value.parse::<usize>() {
                LIMIT.store(n, Ordering::Relaxed);
            }
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Records that phase `what` ended now (printed when tracing is on).
pub fn mark(what: &str) {
    if !enabled() || PRINTED.fetch_add(1, Ordering::Relaxed) >= LIMIT.load(Ordering::Relaxed) {
        return;
    }
    let now = Instant::now();
    let clock = CLOCK.get_or_init(|| Mutex::new((now, now)));
    let Ok(mut c) = clock.lock() else { return };
    let (start, prev) = *c;
    c.1 = now;
    let thread = std::thread::current();
    eprintln!(
        "[startup] {:8.1} ms  +{:7.1} ms  {what} ({})",
        (now - start).as_secs_f64() * 1e3,
        (now - prev).as_secs_f64() * 1e3,
        thread.name().unwrap_or("main")
    );
}
