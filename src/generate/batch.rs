//! Continuous batching: the engine thread's scheduler over every in-flight request of a session
//! whose model can batch (`CausalLm::batchable`). Each tick advances one new request's prefill
//! by one chunk (its own batch-1 caches, prompt-cache reuse as when alone), then runs one decode
//! step for all decoding requests together: their tokens go through each weight matrix once,
//! each row attending to its own cache rows (`nn::batch_kv_cache`) and sampled with its own
//! sampler, seed and penalty. A finished or aborted request leaves at the next step; one whose
//! reasoning budget forces tokens steps out, is fed them alone, and joins again. Steps are
//! pipelined as in `generator::run`: step n+1 is scheduled before step n's tokens are read.
use super::engine::{store_reply, Engine, Event, GenerateJob};
use super::generator::{self, Flow, LoopStats, Sampled, Stepper, TokenStep, TopPending};
use super::options::GenerateReply;
use super::prompt_cache::PromptCachePool;
use super::request::{self, Reply};
use crate::error::{Error, Result};
use crate::mlx::{self, async_eval, memory_stats, Array, Dtype};
use crate::nn::{BatchCaches, LayerCaches};
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One request inside the engine: prefilling alone, then a row of the batch.
struct Row {
    job: GenerateJob,
    prompt: Vec<u32>,
    reply: Reply,
    stepper: Stepper,
    stats: LoopStats,
    queue_ms: f64,
    use_pool: bool,
    /// When its prefill began (TTFT counts from here).
    start: Instant,
    decode_start: Option<Instant>,
    /// Tokens handed to `reply` (forced ones included), against `max_tokens`.
    n: usize,
    /// Cache bytes set aside for it: its prompt and `max_tokens` new tokens.
    reserve: usize,
}

/// A request outside the batch with its own caches: prefilling (`next` None), or ready to join
/// with its next token (lazy) not yet read.
struct Solo {
    row: Row,
    caches: LayerCaches,
    pos: usize,
    next: Option<Sampled>,
}

pub(super) struct Batch {
    /// Taken from the session's queue, waiting for a place in the batch.
    waiting: VecDeque<GenerateJob>,
    /// Prefilling (one chunk per tick, oldest first), or ready to join.
    solo: VecDeque<Solo>,
    rows: Vec<Row>,
    caches: Option<BatchCaches>,
    /// Each row's token (logprob, top logprobs) of the last scheduled step, not read yet.
    pending: Option<Sampled>,
    /// The oldest waiting request, started but not fitting yet (requests start in order).
    held: Option<Solo>,
    max_batch: usize,
    /// Cache bytes the requests in flight may set aside together.
    kv_budget: usize,
    /// Cache bytes one token takes (every layer's keys and values).
    kv_per_token: usize,
}

impl Batch {
    pub(super) fn new(max_batch: usize, kv_budget: usize, kv_per_token: usize) -> Self {
        Batch {
            waiting: VecDeque::new(),
            solo: VecDeque::new(),
            rows: vec![],
            caches: None,
            pending: None,
            held: None,
            max_batch: max_batch.max(1),
            kv_budget,
            kv_per_token,
        }
    }

    /// Whether any request is in flight (the engine then polls its queue instead of waiting).
    pub(super) fn busy(&self) -> bool {
        !self.waiting.is_empty() || !self.solo.is_empty() || !self.rows.is_empty() || self.held.is_some()
    }

    fn in_flight(&self) -> usize {
        self.rows.len() + self.solo.len()
    }

    fn reserved(&self) -> usize {
        self.rows.iter().map(|r| r.reserve).chain(self.solo.iter().map(|s| s.row.reserve)).sum()
    }

    /// Starts waiting requests in order while they fit: `max_batch` requests, and the cache
    /// bytes each sets aside (its prompt and `max_tokens`) within the budget. One that can never
    /// fit is refused (`OUT_OF_MEMORY`) before it starts; one that does not fit yet waits.
    fn admit_waiting(&mut self, engine: &Engine, pool: &mut PromptCachePool) {
        while self.in_flight() < self.max_batch {
            let s = match self.held.take() {
                Some(s) => s,
                None => {
                    let Some(job) = self.waiting.pop_front() else { break };
                    // A request starting on an idle engine reports its own peak memory (as the
                    // single-request path does), not the load's or an earlier request's.
                    if self.in_flight() == 0 {
                        mlx::reset_peak_memory();
                    }
                    match start(engine, job, pool, self.kv_per_token) {
                        Ok(s) => s,
                        Err((job, e)) => {
                            job.events.send(Event::Done(Err(e)));
                            continue;
                        }
                    }
                }
            };
            if s.row.job.abort.load(Ordering::Relaxed) {
                s.row.job.events.send(Event::Done(Err(Error::Aborted)));
                continue;
            }
            if s.row.reserve > self.kv_budget {
                let e = Error::OutOfMemory(format!(
                    "the request needs {} MB of cache ({} prompt tokens + max_tokens {}), more than the session's budget of {} MB (kv_budget_bytes)",
                    s.row.reserve >> 20,
                    s.row.prompt.len(),
                    s.row.job.options.max_tokens,
                    self.kv_budget >> 20
                ));
                s.row.job.events.send(Event::Done(Err(e)));
                continue;
            }
            if self.in_flight() > 0 && self.reserved() + s.row.reserve > self.kv_budget {
                self.held = Some(s);
                break;
            }
            // Its wait for room counts as queueing, not as time to first token.
            let mut s = s;
            s.row.queue_ms = s.row.job.queued_at.elapsed().as_secs_f64() * 1e3;
            s.row.start = Instant::now();
            self.solo.push_back(s);
        }
    }

    pub(super) fn admit(&mut self, job: GenerateJob) {
        self.waiting.push_back(job);
    }

    /// One round of work: start waiting requests that fit, one prefill chunk, one decode step.
    /// A panic fails every request in flight (the engine itself goes on).
    pub(super) fn tick(&mut self, engine: &Engine, pool: &mut PromptCachePool) {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.tick_inner(engine, pool)));
        let err = match res {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(p) => Error::Mlx(format!("internal error: {}", super::engine::panic_message(&p))),
        };
        let _ = mlx::synchronize();
        self.caches = None;
        self.pending = None;
        let solo = std::mem::take(&mut self.solo).into_iter().chain(self.held.take());
        let rows = std::mem::take(&mut self.rows).into_iter().chain(solo.map(|s| s.row));
        for row in rows {
            row.job.events.send(Event::Done(Err(err.duplicate())));
        }
    }

    fn tick_inner(&mut self, engine: &Engine, pool: &mut PromptCachePool) -> Result<()> {
        self.admit_waiting(engine, pool);
        self.prefill(engine)?;
        if !self.rows.is_empty() {
            self.step(engine, pool)?;
        }
        Ok(())
    }

    /// Advances the oldest prefilling request by one chunk (all of its chunks when nothing else
    /// is decoding); requests whose prefill is done take their first step and join the batch.
    fn prefill(&mut self, engine: &Engine) -> Result<()> {
        let model = engine.model.as_ref();
        let decoding = !self.rows.is_empty();
        let mut i = 0;
        let mut chunked = false;
        while i < self.solo.len() {
            let s = &mut self.solo[i];
            if s.row.job.abort.load(Ordering::Relaxed) {
                let s = self.solo.remove(i).expect("in range");
                let _ = mlx::synchronize();
                s.row.job.events.send(Event::Done(Err(Error::Aborted)));
                continue;
            }
            if s.next.is_none() {
                if chunked && decoding {
                    i += 1;
                    continue;
                }
                let r = (|| -> Result<()> {
                    while s.row.prompt.len() - s.pos > 1 {
                        if generator::final_chunk(model, &s.row.prompt, s.pos, &s.row.job.options, s.row.use_pool) {
                            // The last chunk gives the first token too.
                            let next = s.row.stepper.step_prompt(model, &s.row.prompt[s.pos..], &mut s.caches)?;
                            next.schedule()?;
                            crate::startup_trace::mark("last prefill chunk scheduled");
                            s.pos = s.row.prompt.len();
                            s.next = Some(next);
                            return Ok(());
                        }
                        s.pos = generator::prefill_chunk(model, &mut s.caches, &s.row.prompt, s.pos, &s.row.job.options)?;
                        if decoding {
                            break;
                        }
                    }
                    if s.row.prompt.len() - s.pos == 1 {
                        let last = Array::from_slice(&s.row.prompt[s.pos..], &[1, (s.row.prompt.len() - s.pos) as i32])?;
                        let next = s.row.stepper.step(model, &last, &mut s.caches)?;
                        next.schedule()?;
                        s.pos = s.row.prompt.len();
                        s.next = Some(next);
                    }
                    Ok(())
                })();
                chunked = true;
                if let Err(e) = r {
                    let s = self.solo.remove(i).expect("in range");
                    let _ = mlx::synchronize();
                    s.row.job.events.send(Event::Done(Err(e)));
                    continue;
                }
            }
            if self.solo[i].next.is_some() {
                let s = self.solo.remove(i).expect("in range");
                self.join(s)?;
                continue;
            }
            i += 1;
        }
        Ok(())
    }

    /// Adds a request with its caches and unread next token as the batch's last row.
    fn join(&mut self, s: Solo) -> Result<()> {
        let next = s.next.expect("joins with its next token");
        match &mut self.caches {
            Some(c) => c.join(&s.caches)?,
            None => self.caches = Some(BatchCaches::new(&s.caches)?),
        }
        self.pending = Some(match self.pending.take() {
            Some(p) => p.append(next)?,
            None => next,
        });
        self.rows.push(s.row);
        Ok(())
    }

    /// Schedules the next step for every row, then reads and hands over this step's tokens (a
    /// batch of new requests hands its first tokens over first: see `early`).
    fn step(&mut self, engine: &Engine, pool: &mut PromptCachePool) -> Result<()> {
        let pending = self.pending.take().expect("rows have unread tokens");
        let b = self.rows.len();
        let more = self.rows.iter().any(|r| r.n + 1 < r.job.options.max_tokens);
        // When every row waits for its first token, nothing decodes that pipelining would keep
        // busy: the tokens go out before the next step is built, so the time to the first token
        // is the prompt's, not the prompt's plus a step's host time.
        let early = self.rows.iter().all(|r| r.n == 0) && !crate::ablation::get().first_token_early;
        let (next, verdicts) = if early {
            let verdicts = self.hand_over(&pending, more, None)?;
            // No step for a batch that every row leaves.
            let wanted = more && !(verdicts.keep.is_empty() && verdicts.forcing.is_empty());
            (self.schedule(engine, &pending, wanted, Some(&verdicts.ids))?, verdicts)
        } else {
            // Constrained rows need each token before the next mask: such a batch reads this
            // step's tokens before scheduling the next (no pipelining while one is in it).
            let read = if self.rows.iter().any(|r| r.stepper.constrained()) { Some(pending.token.to_vec::<u32>()?) } else { None };
            let next = self.schedule(engine, &pending, more, read.as_deref())?;
            (next, self.hand_over(&pending, more, read)?)
        };
        let Verdicts { keep, leaving, forcing, .. } = verdicts;
        if keep.len() == b {
            self.pending = next;
            return Ok(());
        }

        // Rows stepping out: cut their caches out before the batch lets go of them.
        let caches = self.caches.as_ref().expect("rows have caches");
        let mut out: Vec<(usize, LayerCaches)> = vec![];
        for &(i, _) in &leaving {
            if self.rows[i].use_pool {
                out.push((i, caches.extract(i)?));
            }
        }
        let mut forced_caches = vec![];
        for (i, _, _) in &forcing {
            forced_caches.push(caches.extract(*i)?);
        }
        let scheduled = next.is_some();
        if keep.is_empty() {
            self.caches = None;
            self.pending = None;
        } else {
            self.caches.as_mut().expect("rows have caches").retain(&keep)?;
            self.pending = Some(next.expect("kept rows have a next step").select(&keep)?);
        }
        let mut rows: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        self.rows = keep.iter().map(|&i| rows[i].take().expect("kept once")).collect();
        // Nothing of a leaving request may outlive it (the host may exit once it has its reply).
        if !leaving.is_empty() {
            let _ = mlx::synchronize();
        }
        for (i, res) in leaving {
            let row = rows[i].take().expect("leaves once");
            let held = out.iter().position(|(j, _)| *j == i).map(|p| out.swap_remove(p).1);
            finish(row, res.err(), held, pool);
        }
        for ((i, tokens, replace), caches) in forcing.into_iter().zip(forced_caches) {
            let row = rows[i].take().expect("forced once");
            if let Some(solo) = feed_forced(engine.model.as_ref(), row, caches, tokens, replace, scheduled, pool) {
                self.solo.push_back(solo);
            }
        }
        // Forced rows join again at once (their next token is scheduled).
        let mut i = 0;
        while i < self.solo.len() {
            if self.solo[i].next.is_some() {
                let s = self.solo.remove(i).expect("in range");
                self.join(s)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Builds and schedules the step that feeds `pending`'s tokens (`ids`: those tokens, when
    /// already read), when any row wants more.
    fn schedule(&mut self, engine: &Engine, pending: &Sampled, more: bool, ids: Option<&[u32]>) -> Result<Option<Sampled>> {
        if !more {
            return Ok(None);
        }
        let model = engine.model.as_ref();
        let ys = &pending.token;
        let b = self.rows.len();
        let t = Instant::now();
        let caches = self.caches.as_mut().expect("rows have caches").for_step()?;
        for (i, row) in self.rows.iter_mut().enumerate().filter(|(_, r)| r.stepper.keeps_history()) {
            row.stepper.remember(&ys.slice_axis(0, i as i32, i as i32 + 1)?)?;
        }
        if self.rows.iter().any(|r| r.stepper.constrained()) {
            let read;
            let ids = match ids {
                Some(ids) => ids,
                None => {
                    read = ys.to_vec::<u32>()?;
                    &read[..]
                }
            };
            for (row, &id) in self.rows.iter_mut().zip(ids) {
                row.stepper.feed(&[id])?;
            }
        }
        let mut logits = model.forward(&ys.reshape(&[b as i32, 1])?, caches)?.reshape(&[b as i32, -1])?;
        if self.rows.iter().any(|r| r.stepper.constrained()) {
            logits = masked(&mut self.rows, logits)?;
        }
        let sampled = sample(&mut self.rows, &logits)?;
        let built = Instant::now();
        sampled.schedule()?;
        let (schedule, submit) = (t.elapsed().as_secs_f64(), built.elapsed().as_secs_f64());
        for row in &mut self.rows {
            row.stats.schedule_s += schedule;
            row.stats.submit_s += submit;
            row.stats.steps_scheduled += 1;
        }
        Ok(Some(sampled))
    }

    /// Reads `pending`'s tokens (`ids`: already read) and hands each row its own; says which
    /// rows go on (`more`: a next step is or will be scheduled), leave, or have tokens forced.
    fn hand_over(&mut self, pending: &Sampled, more: bool, ids: Option<Vec<u32>>) -> Result<Verdicts> {
        let b = self.rows.len();
        let t = Instant::now();
        let ids = match ids {
            Some(ids) => ids,
            None => pending.token.to_vec::<u32>()?,
        };
        let logprobs = pending.logprob.astype(Dtype::Float32)?.to_vec::<f32>()?;
        let mut tops = pending.top.read()?;
        let wait = t.elapsed().as_secs_f64();
        let mut v = Verdicts { ids, keep: Vec::with_capacity(b), leaving: vec![], forcing: vec![] };
        for (i, row) in self.rows.iter_mut().enumerate() {
            row.stats.batch_size = row.stats.batch_size.max(b);
            if row.n == 0 {
                row.stats.ttft_s = row.start.elapsed().as_secs_f64();
                row.decode_start = Some(Instant::now());
            } else {
                row.stats.wait_s += wait;
            }
            row.n += 1;
            let step = TokenStep { id: v.ids[i], logprob: logprobs[i], forced: false, top: std::mem::take(&mut tops[i]) };
            match row.reply.on_token(&row.job, step) {
                Ok(Flow::Continue) if row.n < row.job.options.max_tokens && more => v.keep.push(i),
                Ok(Flow::Continue) | Ok(Flow::Stop) => v.leaving.push((i, Ok(()))),
                Ok(Flow::Force(t)) => v.forcing.push((i, t, false)),
                Ok(Flow::Replace(t)) => v.forcing.push((i, t, true)),
                Err(e) => v.leaving.push((i, Err(e))),
            }
        }
        Ok(v)
    }
}

/// A step's tokens as read, and each row's verdict on its own (indices into the batch's rows).
struct Verdicts {
    ids: Vec<u32>,
    keep: Vec<usize>,
    leaving: Vec<(usize, Result<()>)>,
    forcing: Vec<(usize, Vec<u32>, bool)>,
}

/// Ends a request: its reply (or `error`) to its sink; its caches (when kept) to the prompt cache.
fn finish(mut row: Row, error: Option<Error>, caches: Option<LayerCaches>, pool: &mut PromptCachePool) {
    if let Some(e) = error {
        row.job.events.send(Event::Done(Err(e)));
        return;
    }
    if let Some(c) = caches {
        store_reply(pool, &row.prompt, &row.reply.sampled, c);
    }
    row.stats.generated = row.n;
    row.stats.decode_s = row.decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    row.stats.peak_memory = memory_stats().peak;
    let usage = request::usage(row.prompt.len(), row.reply.completion_tokens(), row.queue_ms, &row.stats);
    let job = row.job;
    let reply: Result<GenerateReply> = row.reply.finish(&job, usage);
    job.events.send(Event::Done(reply));
}

/// Picks up `job`: its prompt, the prompt cache's longest prefix, its sampler. The job comes
/// back with the error when it cannot start.
fn start(
    engine: &Engine,
    mut job: GenerateJob,
    pool: &mut PromptCachePool,
    kv_per_token: usize,
) -> std::result::Result<Solo, (GenerateJob, Error)> {
    let queue_ms = job.queued_at.elapsed().as_secs_f64() * 1e3;
    let r = (|| -> Result<(Vec<u32>, LayerCaches, usize, bool, Reply, Stepper, usize)> {
        if job.abort.load(Ordering::Relaxed) {
            return Err(Error::Aborted);
        }
        let prompt = engine.prompt_ids(&job)?;
        let max_tokens = engine.max_tokens_in_context(prompt.len(), &job.options)?;
        let opts = &job.options;
        let use_pool = opts.prompt_cache != Some(false) && pool.cacheable(&prompt);
        let reuse = if use_pool { pool.lookup(&prompt, Instant::now()) } else { None };
        let mut caches = match reuse {
            Some(r) => r.caches,
            None => engine.model.make_caches(),
        };
        let cached = generator::prepare(engine.model.as_ref(), &mut caches, &prompt, opts)?;
        let reply = Reply::new(engine.tokenizer.as_deref(), &engine.eos, &prompt, opts)?;
        let stepper = Stepper::new(opts, &prompt, engine.constraint(&prompt, opts)?)?;
        Ok((prompt, caches, cached, use_pool, reply, stepper, max_tokens))
    })();
    match r {
        Ok((prompt, caches, cached, use_pool, reply, stepper, max_tokens)) => {
            // The context length cuts max_tokens (the reply ends there with `length`).
            job.options.max_tokens = max_tokens;
            let stats = LoopStats { prefilled: prompt.len() - cached, batched: true, ..Default::default() };
            let reserve = prompt.len().saturating_add(job.options.max_tokens).saturating_mul(kv_per_token);
            Ok(Solo {
                row: Row {
                    job,
                    prompt,
                    reply,
                    stepper,
                    stats,
                    queue_ms,
                    use_pool,
                    start: Instant::now(),
                    decode_start: None,
                    n: 0,
                    reserve,
                },
                caches,
                pos: cached,
                next: None,
            })
        }
        Err(e) => Err((job, e)),
    }
}

/// A row whose reply forces tokens (the reasoning budget's closer), stepped out of the batch
/// with its own `caches` (holding its last token when the batch had `scheduled` a step after
/// it): as `generator::run` does alone, the last token is dropped first with `replace`, the
/// forced tokens are handed over and fed, and the row comes back ready to join with its next
/// token; or it finishes here.
fn feed_forced(
    model: &dyn crate::models::CausalLm,
    mut row: Row,
    mut caches: LayerCaches,
    forced: Vec<u32>,
    replace: bool,
    scheduled: bool,
    pool: &mut PromptCachePool,
) -> Option<Solo> {
    let max = row.job.options.max_tokens;
    let end = |row: Row, caches: Option<LayerCaches>, error: Option<Error>, pool: &mut PromptCachePool| {
        let _ = mlx::synchronize();
        let held = if row.use_pool && error.is_none() { caches } else { None };
        finish(row, error, held, pool);
        None
    };
    if !scheduled && !replace {
        return end(row, Some(caches), None, pool);
    }
    if replace {
        row.n -= 1;
        if scheduled {
            if let Err(e) = caches.trim_to(caches.offset().saturating_sub(1)) {
                return end(row, None, Some(e), pool);
            }
        }
    }
    let mut fed = Vec::with_capacity(forced.len());
    for &t in &forced {
        if row.n >= max {
            break;
        }
        row.n += 1;
        fed.push(t);
        match row.reply.on_token(&row.job, TokenStep { id: t, logprob: 0.0, forced: true, top: vec![] }) {
            Ok(Flow::Stop) => return end(row, Some(caches), None, pool),
            Ok(_) => {}
            Err(e) => return end(row, None, Some(e), pool),
        }
    }
    if fed.is_empty() || row.n >= max {
        return end(row, Some(caches), None, pool);
    }
    let vocab = model.vocab_size() as u32;
    if let Some(bad) = fed.iter().find(|&&t| t >= vocab) {
        let e = Error::InvalidArgument(format!("forced token id {bad} is outside the vocabulary (size {vocab})"));
        return end(row, None, Some(e), pool);
    }
    let next = (|| -> Result<Sampled> {
        row.stepper.remember(&Array::from_slice(&fed, &[fed.len() as i32])?)?;
        let next = row.stepper.step(model, &Array::from_slice(&fed, &[1, fed.len() as i32])?, &mut caches)?;
        next.schedule()?;
        Ok(next)
    })();
    match next {
        Ok(next) => {
            let pos = row.prompt.len();
            Some(Solo { row, caches, pos, next: Some(next) })
        }
        Err(e) => end(row, None, Some(e), pool),
    }
}

/// `logits` `[B, V]` with each constrained row's mask added, computed on the host while the
/// device runs the forward pass.
fn masked(rows: &mut [Row], logits: Array) -> Result<Array> {
    async_eval(&[&logits])?;
    let v = logits.dim(-1) as usize;
    let mut all = vec![0f32; rows.len() * v];
    let mut any = false;
    for (row, out) in rows.iter_mut().zip(all.chunks_mut(v)) {
        if let Some(m) = row.stepper.mask(v)? {
            out.copy_from_slice(&m);
            any = true;
        }
    }
    if !any {
        return Ok(logits);
    }
    logits.add(&Array::from_slice(&all, &[rows.len() as i32, v as i32])?.astype(logits.dtype())?)
}

/// Samples every row's next token from `logits` `[B, V]`: tokens `[B]` uint32, logprobs `[B]`
/// float32, and the top logprobs of the rows that ask (computed together, from their rows
/// only). Rows that take the plain argmax are sampled together; otherwise each row by its own
/// sampler (its own key: seeded sampling does not depend on the rest of the batch).
fn sample(rows: &mut [Row], logits: &Array) -> Result<Sampled> {
    let wanted: Vec<usize> = rows.iter().map(|r| r.stepper.top_logprobs()).collect();
    if rows.iter().all(|r| r.stepper.plain_greedy()) {
        let logprobs = logits.subtract(&logits.logsumexp(&[-1], true)?)?;
        let y = logprobs.argmax(-1, false)?.astype(Dtype::Uint32)?;
        let lp = logprobs.take_along_axis(&y.reshape(&[-1, 1])?, -1)?.reshape(&[-1])?.astype(Dtype::Float32)?;
        let top = TopPending::compute(&logprobs, &wanted)?;
        return Ok(Sampled { token: y, logprob: lp, top });
    }
    let mut ys = Vec::with_capacity(rows.len());
    let mut lps = Vec::with_capacity(rows.len());
    let mut asking = vec![];
    for (i, row) in rows.iter_mut().enumerate() {
        let (y, lp, logprobs) = row.stepper.draw(&logits.slice_axis(0, i as i32, i as i32 + 1)?)?;
        ys.push(y);
        lps.push(lp);
        if wanted[i] > 0 {
            asking.push(logprobs);
        }
    }
    let top = match asking.len() {
        0 => TopPending::none(rows.len()),
        _ => TopPending::compute(&Array::concatenate(&asking.iter().collect::<Vec<_>>(), 0)?, &wanted)?,
    };
    Ok(Sampled {
        token: Array::concatenate(&ys.iter().collect::<Vec<_>>(), 0)?,
        logprob: Array::concatenate(&lps.iter().collect::<Vec<_>>(), 0)?,
        top,
    })
}
