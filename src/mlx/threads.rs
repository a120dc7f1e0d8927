//! Threads for MLX work that are reused, not ended. MLX gives every thread that evaluates arrays
//! a default stream of its own, served by a worker thread that MLX never ends (its scheduler has
//! no way to remove a stream). One engine thread per session would so leave one MLX worker behind
//! per closed session; engine threads taken from this pool leave none: a thread whose job has
//! ended waits for the next one, and its stream (and MLX worker) serve that job too. The pool
//! holds at most as many threads as there were sessions open at once.
use std::sync::mpsc;
use std::sync::Mutex;

type Job = Box<dyn FnOnce() + Send>;

/// Idle threads, each waiting on its channel for a job.
static IDLE: Mutex<Vec<mpsc::Sender<Job>>> = Mutex::new(Vec::new());

/// A job started by [`spawn`].
pub struct JobHandle {
    done: mpsc::Receiver<()>,
}

impl JobHandle {
    /// Waits until the job has returned (or panicked); its thread lives on in the pool.
    pub fn join(self) {
        let _ = self.done.recv();
    }
}

/// Runs `f` on an idle pooled thread, or on a new one named `name` when none is idle.
pub fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<JobHandle> {
    let (done_tx, done) = mpsc::channel();
    // `done_tx` goes when the job returns or unwinds: either way `join` returns.
    let mut job: Job = Box::new(move || {
        f();
        let _ = done_tx.send(());
    });
    loop {
        let idle = IDLE.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(tx) => match tx.send(job) {
                Ok(()) => return Ok(JobHandle { done }),
                // That thread is gone (it cannot be, short of a panic): try the next.
                Err(mpsc::SendError(j)) => job = j,
            },
            None => break,
        }
    }
    std::thread::Builder::new().name(name.into()).spawn(move || {
        let mut job = job;
        loop {
            job();
            let (tx, rx) = mpsc::channel();
            IDLE.lock().unwrap_or_else(|e| e.into_inner()).push(tx);
            match rx.recv() {
                Ok(next) => job = next,
                Err(_) => return,
            }
        }
    })?;
    Ok(JobHandle { done })
}

/// Threads of the pool waiting for a job.
pub fn idle_threads() -> usize {
    IDLE.lock().map(|v| v.len()).unwrap_or(0)
}
