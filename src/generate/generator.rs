//! The token loop: chunked prefill, then decode with the next step's graph built and scheduled
//! (async_eval) before the current token is read, so host work overlaps device work — the
//! pipelining of mlx-lm's `generate_step`.
use super::constraint::Constraint;
use super::options::GenerateOptions;
use super::sampler::Sampler;
use crate::models::vision_lm::is_media_token;
use crate::error::{Error, Result};
use crate::mlx::{async_eval, eval, memory_stats, reset_peak_memory, Array, Dtype};
use crate::models::CausalLm;
use crate::nn::LayerCaches;
use std::time::Instant;

/// One decoded token and its log probability.
#[derive(Debug, Clone)]
pub struct TokenStep {
    pub id: u32,
    /// 0 for forced tokens (they were fed, not sampled).
    pub logprob: f32,
    /// Fed by the caller through [`Flow::Force`]/[`Flow::Replace`] rather than sampled.
    pub forced: bool,
    /// With `top_logprobs`: the most likely (id, logprob) at this step, most likely first.
    /// Empty otherwise, and for forced tokens.
    pub top: Vec<(u32, f32)>,
}

/// A step's sampled tokens, scheduled or about to be, not read yet: one per row of the step
/// (1 alone, B in a batch).
pub(crate) struct Sampled {
    /// Token ids `[R]` (uint32).
    pub(crate) token: Array,
    /// Their log probabilities `[R]` (float32).
    pub(crate) logprob: Array,
    /// The top logprobs of the rows that asked for them.
    pub(crate) top: TopPending,
}

impl Sampled {
    /// Starts computing it (`async_eval`), the top logprobs included.
    pub(crate) fn schedule(&self) -> Result<()> {
        let mut arrays = vec![&self.token, &self.logprob];
        arrays.extend(self.top.blocks.iter());
        async_eval(&arrays)
    }

    /// Its rows `keep`, in that order.
    pub(crate) fn select(&self, keep: &[usize]) -> Result<Sampled> {
        let idx: Vec<i32> = keep.iter().map(|&i| i as i32).collect();
        let idx = Array::from_slice(&idx, &[idx.len() as i32])?;
        Ok(Sampled { token: self.token.take(&idx, 0)?, logprob: self.logprob.take(&idx, 0)?, top: self.top.select(keep) })
    }

    /// Its rows, then `other`'s.
    pub(crate) fn append(self, other: Sampled) -> Result<Sampled> {
        Ok(Sampled {
            token: Array::concatenate(&[&self.token, &other.token], 0)?,
            logprob: Array::concatenate(&[&self.logprob, &other.logprob], 0)?,
            top: self.top.append(other.top),
        })
    }
}

/// The top logprobs of a step's rows, not read yet. Each block is `[r, 2k]` float32: per row,
/// the ids of its `k` most likely tokens (as floats: exact below 2^24) then their logprobs, in
/// no order (one read per block; a step's rows share one block, except right after a request
/// joined the batch). For each row of the step: where its own are (block, row in the block, how
/// many it asked for), None when it did not ask (it costs nothing then).
#[derive(Clone, Default)]
pub(crate) struct TopPending {
    blocks: Vec<Array>,
    at: Vec<Option<(usize, usize, usize)>>,
}

impl TopPending {
    /// No row asked: nothing to compute or read.
    pub(crate) fn none(rows: usize) -> Self {
        TopPending { blocks: vec![], at: vec![None; rows] }
    }

    /// The top logprobs of the rows that ask for them (`wanted[i]` > 0, at most the vocabulary)
    /// from `logprobs` `[R, V]`, built into the graph: `logprobs` holds either every row of the
    /// step or only those that ask (in order).
    pub(crate) fn compute(logprobs: &Array, wanted: &[usize]) -> Result<Self> {
        let asking: Vec<usize> = (0..wanted.len()).filter(|&i| wanted[i] > 0).collect();
        if asking.is_empty() {
            return Ok(Self::none(wanted.len()));
        }
        let sub = if logprobs.dim(0) as usize == asking.len() {
            logprobs.clone()
        } else {
            let idx: Vec<i32> = asking.iter().map(|&i| i as i32).collect();
            logprobs.take(&Array::from_slice(&idx, &[idx.len() as i32])?, 0)?
        };
        let k = (asking.iter().map(|&i| wanted[i]).max().unwrap_or(1) as i32).min(sub.dim(-1));
        let (ids, values) = top_k(&sub, k)?;
        let block = Array::concatenate(&[&ids.astype(Dtype::Float32)?, &values.astype(Dtype::Float32)?], -1)?;
        let mut at = vec![None; wanted.len()];
        for (j, &i) in asking.iter().enumerate() {
            at[i] = Some((0, j, wanted[i]));
        }
        Ok(TopPending { blocks: vec![block], at })
    }

    /// The arrays to schedule with the step (none when no row asked).
    pub(crate) fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.blocks.iter()
    }

    fn select(&self, keep: &[usize]) -> Self {
        let at: Vec<_> = keep.iter().map(|&i| self.at[i]).collect();
        let blocks = if at.iter().any(Option::is_some) { self.blocks.clone() } else { vec![] };
        TopPending { blocks, at }
    }

    fn append(mut self, other: TopPending) -> Self {
        let offset = self.blocks.len();
        self.blocks.extend(other.blocks);
        self.at.extend(other.at.into_iter().map(|a| a.map(|(b, r, n)| (b + offset, r, n))));
        self
    }

    /// Waits for the blocks and reads them: each row's list, most likely first (ties: lower id
    /// first, as argmax picks), tokens the model cannot produce (logprob -inf: an output
    /// constraint's mask) left out.
    pub(crate) fn read(&self) -> Result<Vec<Vec<(u32, f32)>>> {
        let mut data: Vec<Option<Vec<f32>>> = vec![None; self.blocks.len()];
        let mut out = Vec::with_capacity(self.at.len());
        for &a in &self.at {
            let Some((b, r, n)) = a else {
                out.push(vec![]);
                continue;
            };
            let k = self.blocks[b].dim(-1) as usize / 2;
            let v = match &mut data[b] {
                Some(v) => v,
                slot => slot.insert(self.blocks[b].to_vec::<f32>()?),
            };
            let row = &v[r * 2 * k..(r + 1) * 2 * k];
            let mut top: Vec<(u32, f32)> =
                (0..k).map(|j| (row[j] as u32, row[k + j])).filter(|&(_, lp)| lp > f32::NEG_INFINITY).collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            top.truncate(n);
            out.push(top);
        }
        Ok(out)
    }
}

/// The `k` (at most the vocabulary) largest of `logprobs` `[R, V]` in no order: (ids `[R, k]`
/// uint32, values `[R, k]`). In two stages, because a partition of the whole vocabulary is slow
/// (on the CPU, 0.5 ms at V = 49k, as much as the rest of sampling): the vocabulary in blocks
/// of `s` (padded with -inf), each block's max, the `k` blocks of largest max (each of the `k`
/// largest values lies in one of them), then a partition of those `k·s` candidates only.
fn top_k(logprobs: &Array, k: i32) -> Result<(Array, Array)> {
    let (r, v) = (logprobs.dim(0), logprobs.dim(-1));
    let s = ((v as f64).sqrt() as u32).next_power_of_two().clamp(16, 256) as i32;
    let g = (v + s - 1) / s;
    let padded = if g * s > v {
        let fill = Array::scalar_f32(f32::NEG_INFINITY, logprobs.dtype())?.broadcast_to(&[r, g * s - v])?;
        Array::concatenate(&[logprobs, &fill], -1)?
    } else {
        logprobs.clone()
    };
    let blocks = padded.reshape(&[r, g, s])?;
    let kb = k.min(g);
    let best = blocks.max(&[-1], false)?.argpartition(g - kb, -1)?.slice_axis(-1, g - kb, g)?;
    let candidates = blocks.take_along_axis(&best.reshape(&[r, kb, 1])?, 1)?.reshape(&[r, kb * s])?;
    let n = kb * s;
    let at = candidates.argpartition(n - k, -1)?.slice_axis(-1, n - k, n)?;
    let values = candidates.take_along_axis(&at, -1)?;
    let s = Array::from_slice(&[s as u32], &[1])?;
    let ids = best.take_along_axis(&at.floor_divide(&s)?, -1)?.multiply(&s)?.add(&at.remainder(&s)?)?;
    Ok((ids, values))
}

/// Timings of one run of the loop.
#[derive(Debug, Clone, Default)]
pub struct LoopStats {
    /// Prompt tokens computed (not served from a cache).
    pub prefilled: usize,
    pub generated: usize,
    pub ttft_s: f64,
    pub decode_s: f64,
    /// Host time building and scheduling decode steps, and how many were scheduled.
    pub schedule_s: f64,
    /// The part of `schedule_s` spent inside `async_eval` (MLX encoding the step's kernels).
    pub submit_s: f64,
    /// Host time blocked reading each token (the device had not finished its step).
    pub wait_s: f64,
    pub steps_scheduled: usize,
    pub peak_memory: usize,
    /// The most requests decoding in one step with this one (1: alone).
    pub batch_size: usize,
    /// Whether it ran as a row of a continuous batch (false: the model's caches cannot batch,
    /// requests run one after another).
    pub batched: bool,
    /// Speculative decoding: tokens drafted, of those accepted, and the model's forward passes
    /// that verified them (0 without speculation).
    pub drafted: usize,
    pub accepted: usize,
    pub verify_steps: usize,
    /// Pipelined passes built on a guess that did not hold (see `speculative::run`).
    pub dropped_passes: usize,
}

/// What to do after a token was handed to the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
    /// Keep this token, then feed these tokens instead of sampling (each is handed to the
    /// callback as a forced step, and counts towards `max_tokens`); sampling resumes after them.
    /// Used to close a reasoning span when its budget is spent.
    Force(Vec<u32>),
    /// Like `Force`, but this token is dropped first (it is not counted and leaves no KV state).
    Replace(Vec<u32>),
}

/// One request's sampling state: its sampler (and random key), its recent tokens, and its
/// output constraint.
pub(crate) struct Stepper {
    sampler: Sampler,
    /// The most recent tokens (lazy), for the repetition penalty.
    history: Option<Array>,
    history_len: usize,
    temperature: f32,
    constraint: Option<Constraint>,
    /// The prompt has been fed (later inputs are generated tokens, which the constraint takes).
    started: bool,
    /// How many top logprobs each step reports (0: none).
    top_logprobs: usize,
}

impl Stepper {
    /// The sampling state of a request on `prompt` (whose tail seeds the penalty's history).
    pub(crate) fn new(opts: &GenerateOptions, prompt: &[u32], constraint: Option<Constraint>) -> Result<Self> {
        let mut stepper = Stepper {
            sampler: Sampler::new(&opts.sampling)?,
            history: None,
            history_len: if opts.sampling.repetition_penalty != 1.0 { opts.sampling.repetition_context_size } else { 0 },
            temperature: opts.sampling.temperature,
            constraint,
            started: false,
            top_logprobs: opts.top_logprobs.unwrap_or(0),
        };
        if stepper.history_len > 0 {
            let tail = &prompt[prompt.len().saturating_sub(stepper.history_len)..];
            stepper.history = Some(Array::from_slice(tail, &[tail.len() as i32])?);
        }
        Ok(stepper)
    }

    /// Whether it keeps recent tokens (for the repetition penalty).
    pub(crate) fn keeps_history(&self) -> bool {
        self.history_len > 0
    }

    /// Argmax without a penalty: rows like this in a batch are sampled together.
    pub(crate) fn plain_greedy(&self) -> bool {
        self.temperature == 0.0 && self.history_len == 0
    }

    /// How many top logprobs each step reports (0: none).
    pub(crate) fn top_logprobs(&self) -> usize {
        self.top_logprobs
    }

    /// Whether its output is constrained now (then each step waits for the token before it:
    /// the next mask depends on it). A lazy tool-call constraint is not until a call opens.
    pub(crate) fn constrained(&self) -> bool {
        self.constraint.as_ref().is_some_and(|c| c.engaged())
    }

    /// Hands generated tokens (as they are fed back) to the constraint.
    pub(crate) fn feed(&mut self, ids: &[u32]) -> Result<()> {
        match &mut self.constraint {
            Some(c) => c.feed(ids),
            None => Ok(()),
        }
    }

    /// The next token's additive mask (`vocab` long), when the constraint is active.
    pub(crate) fn mask(&mut self, vocab: usize) -> Result<Option<Vec<f32>>> {
        match self.constraint.as_mut().filter(|c| c.active()) {
            Some(c) => {
                let mut m = c.mask()?;
                m.resize(vocab, f32::NEG_INFINITY);
                Ok(Some(m))
            }
            None => Ok(None),
        }
    }

    /// Runs `input` `[1, L]` through `model` and samples the next token.
    pub(crate) fn step(&mut self, model: &dyn CausalLm, input: &Array, caches: &mut LayerCaches) -> Result<Sampled> {
        if self.started && self.constrained() {
            self.feed(&input.to_vec::<u32>()?)?;
        }
        self.started = true;
        let logits = model.forward(input, caches)?;
        self.sample_last(logits)
    }

    /// The last chunk of a prompt, its last token included ([`final_chunk`]), through `model`'s
    /// prompt path (which takes image ids), computing the logits of the last position only; then
    /// samples the first token from them, as [`Self::step`] would have from a one-token step.
    pub(crate) fn step_prompt(&mut self, model: &dyn CausalLm, ids: &[u32], caches: &mut LayerCaches) -> Result<Sampled> {
        if self.started && self.constrained() {
            self.feed(ids)?;
        }
        self.started = true;
        let logits = {
            let _last = crate::models::LastPositionLogits::scope();
            model.forward_prompt(ids, caches)?
        };
        self.sample_last(logits)
    }

    /// Samples from the last position of `logits` `[1, L, V]` (the constraint's mask applied).
    fn sample_last(&mut self, logits: Array) -> Result<Sampled> {
        let l = logits.dim(1);
        let mut logits = logits.slice_axis(1, l - 1, l)?.reshape(&[1, -1])?;
        if self.constraint.as_ref().is_some_and(|c| c.active()) {
            // The mask is computed on the host while the device runs the forward pass.
            async_eval(&[&logits])?;
            let v = logits.dim(-1);
            if let Some(m) = self.mask(v as usize)? {
                logits = logits.add(&Array::from_slice(&m, &[1, v])?.astype(logits.dtype())?)?;
            }
        }
        self.sample(&logits)
    }

    /// Samples the next token from `logits` `[1, V]`, with its top logprobs when asked.
    pub(crate) fn sample(&mut self, logits: &Array) -> Result<Sampled> {
        let (token, logprob, logprobs) = self.draw(logits)?;
        let top = TopPending::compute(&logprobs, &[self.top_logprobs])?;
        Ok(Sampled { token, logprob, top })
    }

    /// Samples the next token from `logits` `[1, V]`: (token `[1]`, its logprob `[1]`, the
    /// logprobs it was drawn from `[1, V]`: after the penalty, before the sampling filters).
    pub(crate) fn draw(&mut self, logits: &Array) -> Result<(Array, Array, Array)> {
        let logits = self.sampler.penalize(logits, self.history.as_ref())?;
        let logprobs = logits.subtract(&logits.logsumexp(&[-1], true)?)?;
        let token = self.sampler.sample(&logprobs)?;
        // Float32 in the graph, so reading it needs no conversion op: any op created after the
        // next step was scheduled makes the read wait on MLX's in-flight limit (see
        // `mlex_array_read`), and the device would idle between steps.
        let lp = logprobs.take_along_axis(&token.reshape(&[1, 1])?, -1)?.reshape(&[1])?.astype(Dtype::Float32)?;
        Ok((token, lp, logprobs))
    }

    /// Adds fed tokens to the penalty's history.
    pub(crate) fn remember(&mut self, token: &Array) -> Result<()> {
        if self.history_len == 0 {
            return Ok(());
        }
        let t = token.astype(Dtype::Uint32)?.reshape(&[-1])?;
        let h = match &self.history {
            Some(h) => Array::concatenate(&[h, &t], 0)?,
            None => t,
        };
        let n = h.dim(0);
        let keep = self.history_len as i32;
        self.history = Some(if n > keep { h.slice_axis(0, n - keep, n)? } else { h });
        Ok(())
    }
}

/// Checks `prompt` and `opts`, and brings `caches` back to the longest prefix of `prompt` (but
/// its last token) they can resume from; returns how many tokens that is.
pub(crate) fn prepare(model: &dyn CausalLm, caches: &mut LayerCaches, prompt: &[u32], opts: &GenerateOptions) -> Result<usize> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt is empty: at least one token is needed".into()));
    }
    let vocab = model.vocab_size() as u32;
    let images = model.image_prompt().is_some();
    if let Some(&bad) = prompt.iter().find(|&&t| t >= vocab && !(images && is_media_token(t))) {
        if is_media_token(bad) {
            return Err(Error::InvalidArgument("the prompt holds images, and this model takes none".into()));
        }
        return Err(Error::InvalidArgument(format!("prompt token id {bad} is outside the vocabulary (size {vocab})")));
    }
    opts.sampling.validate().map_err(Error::InvalidArgument)?;
    let cached = caches.offset().min(prompt.len() - 1);
    if caches.can_trim_to(cached) {
        caches.trim_to(cached)?;
        Ok(cached)
    } else {
        // A state that cannot go back (a sliding window past its slack): start over.
        *caches = model.make_caches();
        Ok(0)
    }
}

/// Prefills the next chunk of `prompt` after its first `pos` tokens (everything but the last
/// token, at most `prefill_step_size` at a time), evaluating the caches so the graph (and its
/// memory) stays bounded (the last chunk is only scheduled); returns the new position.
pub(crate) fn prefill_chunk(
    model: &dyn CausalLm,
    caches: &mut LayerCaches,
    prompt: &[u32],
    pos: usize,
    opts: &GenerateOptions,
) -> Result<usize> {
    let n = (prompt.len() - 1 - pos).min(opts.prefill_step_size.max(1));
    let n = model.prefill_chunk_len(&prompt[pos..prompt.len() - 1], n);
    if n == 0 {
        return Ok(pos);
    }
    model.forward_prompt(&prompt[pos..pos + n], caches)?;
    if pos + n == prompt.len() - 1 && !crate::ablation::get().prefill_overlap {
        // The last chunk: the first step is built on the host while the device runs it (its
        // memory is bounded by the chunk).
        async_eval(&caches.state())?;
        crate::startup_trace::mark("last prefill chunk scheduled");
    } else {
        eval(&caches.state())?;
        crate::startup_trace::mark("prefill chunk evaluated");
    }
    Ok(pos + n)
}

/// Whether the rest of `prompt` after its first `pos` tokens, its last token included, is taken
/// by one prefill chunk: then that chunk also gives the first token (`Stepper::step_prompt`),
/// instead of a prefill of all but the last token and a one-token step after it (one pass over
/// the weights fewer: 5–6 ms of a short prompt's time to first token on a 2-core CPU).
///
/// Only where that gives mlx-lm's result, which always steps the last token alone: float32
/// compute (the chunk's last row agrees with a one-token step to ~1e-5 in the conformance
/// suite; in bfloat16 its different roundings moved logprobs by up to 0.1), on plain caches
/// (a rotating cache changes which keys the last token sees, a quantized one whether they are
/// quantized when it does). And not for a request whose caches go to the prompt cache
/// (`pooled`): a later request resuming from them steps the last token alone, and a cache hit
/// gives the cold run's reply bit for bit (the one-shot CLI keeps no entry: there it folds).
pub(crate) fn final_chunk(model: &dyn CausalLm, prompt: &[u32], pos: usize, opts: &GenerateOptions, pooled: bool) -> bool {
    let rest = prompt.len() - pos;
    rest > 1
        && !pooled
        && model.dtype() == Dtype::Float32
        && !opts.kv_cache.runs_alone()
        && rest <= opts.prefill_step_size.max(1)
        && model.prefill_chunk_len(&prompt[pos..], rest) == rest
        && !crate::ablation::get().prompt_fold
}

/// Generates from `prompt`, of which the first `caches.offset()` tokens are already in `caches`.
/// `on_token` is called once per token and decides whether to go on; `max_tokens` is enforced here.
/// When a layer keeps a recurrent state (which cannot be taken back to earlier positions) and
/// `snapshot` is given, it receives a copy of the caches holding the prompt but its last token,
/// for the prompt cache to resume from (see `generate::prompt_cache`). Sliding windows need none:
/// they keep enough slack to step back a few tokens.
pub fn run(
    model: &dyn CausalLm,
    caches: &mut LayerCaches,
    prompt: &[u32],
    opts: &GenerateOptions,
    snapshot: Option<&mut Option<LayerCaches>>,
    constraint: Option<Constraint>,
    mut on_token: impl FnMut(TokenStep) -> Result<Flow>,
) -> Result<LoopStats> {
    let cached = prepare(model, caches, prompt, opts)?;
    let vocab = model.vocab_size() as u32;

    reset_peak_memory();
    let start = Instant::now();
    let mut stepper = Stepper::new(opts, prompt, constraint)?;

    let mut pos = cached;
    // `snapshot` is given when the caches go to the prompt cache: no fold then (`final_chunk`).
    let pooled = snapshot.is_some();
    while prompt.len() - pos > 1 && !final_chunk(model, prompt, pos, opts, pooled) {
        pos = prefill_chunk(model, caches, prompt, pos, opts)?;
    }
    if let Some(out) = snapshot {
        if pos > cached && caches.has_recurrent_state() {
            // Copies of handles: the arrays are shared, and the first write after this copies
            // the buffer it touches (MLX does not donate a buffer that is still referenced).
            *out = Some(caches.clone());
        }
    }
    let mut y = if prompt.len() - pos > 1 {
        stepper.step_prompt(model, &prompt[pos..], caches)?
    } else {
        stepper.step(model, &Array::from_slice(&prompt[pos..], &[1, 1])?, caches)?
    };
    y.schedule()?;

    let mut stats = LoopStats { prefilled: prompt.len() - cached, batch_size: 1, ..Default::default() };
    // Benchmark ablation only (src/ablation.rs): finish each token before building the next step.
    let no_pipelining = crate::ablation::get().pipelining;
    // The first token is handed over before the next step is built: the time to the first token
    // is the prompt's, not the prompt's plus a decode step's host time. Later steps overlap.
    let first_early = !crate::ablation::get().first_token_early;
    let mut decode_start = None;
    let mut n = 0usize;
    'decode: loop {
        if no_pipelining {
            eval(&[&y.token, &y.logprob])?;
        }
        let early = n == 0 && first_early;
        let more = n + 1 < opts.max_tokens;
        let mut next = if more && !early { Some(schedule_next(model, &mut stepper, &y, caches, &mut stats)?) } else { None };
        if n >= opts.max_tokens {
            break;
        }
        let t = Instant::now();
        let id = y.token.to_vec::<u32>()?[0];
        let logprob = y.logprob.item_f32()?;
        let top = y.top.read()?.pop().unwrap_or_default();
        if n > 0 {
            stats.wait_s += t.elapsed().as_secs_f64();
        }
        if n == 0 {
            stats.ttft_s = start.elapsed().as_secs_f64();
            decode_start = Some(Instant::now());
        }
        n += 1;
        let flow = on_token(TokenStep { id, logprob, forced: false, top })?;
        if more && early && flow != Flow::Stop {
            next = Some(schedule_next(model, &mut stepper, &y, caches, &mut stats)?);
        }
        let (forced, replace) = match flow {
            Flow::Stop => break,
            Flow::Continue => match next {
                Some(ny) => {
                    y = ny;
                    continue;
                }
                None => break,
            },
            Flow::Force(t) => (t, false),
            Flow::Replace(t) => (t, true),
        };
        // The step scheduled above fed `id` (its KV state is wanted, unless replaced) and sampled
        // a successor that is now discarded. Without it there is no room for more tokens.
        let scheduled = next.is_some();
        if !scheduled && !replace {
            break;
        }
        drop(next);
        if replace {
            n -= 1;
            if scheduled {
                caches.trim_to(caches.offset().saturating_sub(1))?;
            }
        }
        let mut fed = Vec::with_capacity(forced.len());
        for &t in &forced {
            if n >= opts.max_tokens {
                break;
            }
            n += 1;
            fed.push(t);
            if on_token(TokenStep { id: t, logprob: 0.0, forced: true, top: vec![] })? == Flow::Stop {
                break 'decode;
            }
        }
        if fed.is_empty() || n >= opts.max_tokens {
            break;
        }
        if let Some(bad) = fed.iter().find(|&&t| t >= vocab) {
            return Err(Error::InvalidArgument(format!("forced token id {bad} is outside the vocabulary (size {vocab})")));
        }
        let input = Array::from_slice(&fed, &[1, fed.len() as i32])?;
        let t = Array::from_slice(&fed, &[fed.len() as i32])?;
        stepper.remember(&t)?;
        let ny = stepper.step(model, &input, caches)?;
        ny.schedule()?;
        y = ny;
    }
    stats.generated = n;
    stats.decode_s = decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    stats.peak_memory = memory_stats().peak;
    Ok(stats)
}

/// Builds and schedules the decode step that feeds `y`'s token, counting its host time.
fn schedule_next(
    model: &dyn CausalLm,
    stepper: &mut Stepper,
    y: &Sampled,
    caches: &mut LayerCaches,
    stats: &mut LoopStats,
) -> Result<Sampled> {
    let t = Instant::now();
    stepper.remember(&y.token)?;
    let ny = stepper.step(model, &y.token.reshape(&[1, 1])?, caches)?;
    let built = Instant::now();
    ny.schedule()?;
    stats.submit_s += built.elapsed().as_secs_f64();
    stats.schedule_s += t.elapsed().as_secs_f64();
    stats.steps_scheduled += 1;
    Ok(ny)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlx::random;

    #[test]
    fn top_k_in_two_stages_finds_the_k_largest_of_every_row() {
        let mut key = random::RandomKey::new(3).unwrap();
        for v in [1, 7, 16, 259, 1000, 5003] {
            let x = random::normal(&[3, v], Dtype::Float32, 2.0, &key.next().unwrap()).unwrap();
            let host = x.to_vec::<f32>().unwrap();
            for k in [1, 5, 20].map(|k: i32| k.min(v)) {
                let (ids, values) = top_k(&x, k).unwrap();
                let (ids, values) = (ids.to_vec::<u32>().unwrap(), values.to_vec::<f32>().unwrap());
                for r in 0..3 {
                    let row = &host[r * v as usize..(r + 1) * v as usize];
                    let mut want: Vec<u32> = (0..v as u32).collect();
                    want.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
                    want.truncate(k as usize);
                    want.sort();
                    let k = k as usize;
                    let mut got = ids[r * k..(r + 1) * k].to_vec();
                    for (id, val) in got.iter().zip(&values[r * k..(r + 1) * k]) {
                        assert_eq!(row[*id as usize], *val, "V={v} k={k} row {r}");
                    }
                    got.sort();
                    assert_eq!(got, want, "V={v} k={k} row {r}");
                }
            }
        }
    }
}
