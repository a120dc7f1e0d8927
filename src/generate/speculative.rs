//! Speculative decoding: a cheap drafter proposes the next few tokens, the model checks them
//! all in one forward pass, and every draft it agrees with is a token that cost no pass of its
//! own. Two drafters: prompt lookup (the latest earlier occurrence in the context of its last
//! n-gram, and the tokens that followed it: no second model) and a draft model (a smaller model
//! of the same vocabulary, decoding autoregressively).
//!
//! Greedy requests keep exactly the tokens of plain decoding: the longest prefix of drafts equal
//! to the model's argmax at each position, then the model's own token. Sampled requests keep the
//! model's distribution by the standard acceptance rule: draft `x` is accepted with probability
//! `min(1, p(x) / q(x))`; at the first rejection the token is drawn from the residual
//! `max(0, p - q)` normalized; when every draft is accepted, from `p` at the next position.
//! For prompt lookup `q` is a point mass on the draft (accept with probability `p(x)`).
//! `p` and `q` are the distributions the sampler would draw from (after top-p, min-p, top-k,
//! at the temperature). A request that speculates runs alone, outside the continuous batch;
//! after each pass both caches are trimmed back to the tokens kept.
//!
//! Not speculated (plain decoding instead): a repetition penalty (each position's penalty
//! would depend on the drafts before it), an active output constraint (each mask depends on
//! the token before it), a model whose caches cannot be taken back (recurrent states).
use super::generator::{self, Flow, LoopStats, TokenStep, TopPending};
use super::options::{GenerateOptions, SamplingConfig};
use super::sampler::Sampler;
use crate::error::{Error, Result};
use crate::loader::{resolve_model_path, ModelConfig, Vb, WeightStore};
use crate::mlx::{async_eval, eval, memory_stats, reset_peak_memory, Array, Dtype};
use crate::models::{build_model, CausalLm};
use crate::nn::LayerCaches;
use crate::schema::Fields;
use crate::tokenizer::Tokenizer;
use serde_json::Value;
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

/// Pipelined lookup builds the next pass on a guess only while this share of recent passes
/// (a moving average) kept every draft. A dropped guess costs the host a whole pass of encoding,
/// which is what bounds a pass on the H200 (5–7 ms against a 1–1.3 ms wait for the device), so
/// guessing pays only when it is nearly always right: on the Qwen2.5-Coder edit (two passes in
/// three kept every draft) guessing every pass lost 4 %, on a copy (97 %) it gained 16 %.
const GUESS_WHEN_KEPT: f64 = 0.8;
/// The weight of the latest pass in that moving average.
const GUESS_AVERAGE_WEIGHT: f64 = 0.2;

/// Tokens drafted per pass unless the request says otherwise (mlx-lm's default).
pub const DEFAULT_NUM_DRAFT_TOKENS: usize = 3;
/// The longest n-gram prompt lookup matches unless the request says otherwise.
pub const DEFAULT_MAX_NGRAM: usize = 3;
/// The most tokens a pass may draft.
pub const MAX_NUM_DRAFT_TOKENS: usize = 64;
const MAX_NGRAM_LIMIT: usize = 16;
const LOOKUP_FIELDS: &[&str] = &["max_ngram", "num_draft_tokens"];

/// Prompt lookup's settings (`prompt_lookup: true` or an object of them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptLookup {
    /// The longest n-gram matched (tried from this length down to 1).
    pub max_ngram: usize,
    /// Tokens drafted per pass (None: the request's `num_draft_tokens`, else 3).
    pub num_draft_tokens: Option<usize>,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { max_ngram: DEFAULT_MAX_NGRAM, num_draft_tokens: None }
    }
}

/// Reads `draft_model`, `num_draft_tokens` and `prompt_lookup` into `o`.
pub(crate) fn read_options(f: &Fields, o: &mut GenerateOptions) -> std::result::Result<(), String> {
    o.draft_model = f.string("draft_model")?.map(str::to_string);
    o.num_draft_tokens = f.count("num_draft_tokens")?;
    o.prompt_lookup = match f.raw("prompt_lookup") {
        None | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(PromptLookup::default()),
        Some(Value::Object(_)) => {
            let g = f.nested("prompt_lookup", LOOKUP_FIELDS)?;
            let max_ngram = g.count("max_ngram")?.unwrap_or(DEFAULT_MAX_NGRAM);
            if !(1..=MAX_NGRAM_LIMIT).contains(&max_ngram) {
                return Err(format!("{} must be in [1, {MAX_NGRAM_LIMIT}], got {max_ngram}", g.name("max_ngram")));
            }
            let num_draft_tokens = g.count("num_draft_tokens")?;
            if let Some(k) = num_draft_tokens.filter(|&k| k > MAX_NUM_DRAFT_TOKENS) {
                return Err(format!("{} must be in [0, {MAX_NUM_DRAFT_TOKENS}], got {k}", g.name("num_draft_tokens")));
            }
            Some(PromptLookup { max_ngram, num_draft_tokens })
        }
        Some(v) => return Err(format!("{} must be true, false or an object {{max_ngram, num_draft_tokens}}, got {v}", f.name("prompt_lookup"))),
    };
    Ok(())
}

/// Rejects speculative settings no generation could honour (snake_case names).
pub(crate) fn validate(o: &GenerateOptions) -> std::result::Result<(), String> {
    if let Some(k) = o.num_draft_tokens.filter(|&k| k > MAX_NUM_DRAFT_TOKENS) {
        return Err(format!("num_draft_tokens must be in [0, {MAX_NUM_DRAFT_TOKENS}], got {k}"));
    }
    if let Some(p) = &o.prompt_lookup {
        if !(1..=MAX_NGRAM_LIMIT).contains(&p.max_ngram) {
            return Err(format!("prompt_lookup.max_ngram must be in [1, {MAX_NGRAM_LIMIT}], got {}", p.max_ngram));
        }
    }
    Ok(())
}

/// The tokens prompt lookup drafts after `ctx`: for n from `max_ngram` down to 1, the latest
/// earlier occurrence of the last n tokens, and up to `k` tokens that followed it (empty when
/// no n-gram recurs).
pub fn lookup(ctx: &[u32], max_ngram: usize, k: usize) -> Vec<u32> {
    let len = ctx.len();
    if k == 0 || len < 2 {
        return vec![];
    }
    for n in (1..=max_ngram.min(len - 1)).rev() {
        let tail = &ctx[len - n..];
        if let Some(start) = (0..len - n).rev().find(|&s| &ctx[s..s + n] == tail) {
            let from = start + n;
            return ctx[from..(from + k).min(len)].to_vec();
        }
    }
    vec![]
}

/// The acceptance rule over one verified pass. `p`: the model's distributions at the
/// `drafts.len() + 1` positions (rows of `v` probabilities); `q`: the draft model's at the
/// drafts' positions (rows of its `vq <= v` probabilities), None for a point mass on each draft
/// (prompt lookup); `uniform` draws from [0, 1). Returns how many drafts are accepted and the
/// token that follows them (drawn from the residual at a rejection, from `p` after the last).
pub fn accept(drafts: &[u32], p: &[f32], q: Option<(&[f32], usize)>, v: usize, uniform: &mut impl FnMut() -> f64) -> (usize, u32) {
    for (i, &d) in drafts.iter().enumerate() {
        let pi = &p[i * v..(i + 1) * v];
        let qi = |t: usize| -> f64 {
            match q {
                Some((q, vq)) => if t < vq { q[i * vq + t] as f64 } else { 0.0 },
                None => if t == d as usize { 1.0 } else { 0.0 },
            }
        };
        let (px, qx) = (pi[d as usize] as f64, qi(d as usize));
        let ratio = if qx > 0.0 { px / qx } else { 1.0 };
        if uniform() < ratio.min(1.0) {
            continue;
        }
        let residual: Vec<f64> = (0..v).map(|t| (pi[t] as f64 - qi(t)).max(0.0)).collect();
        return (i, draw(&residual, uniform()));
    }
    let last: Vec<f64> = p[drafts.len() * v..(drafts.len() + 1) * v].iter().map(|&x| x as f64).collect();
    (drafts.len(), draw(&last, uniform()))
}

/// The index `u` (in [0, 1)) falls on in the cumulative, normalized weights `w`.
fn draw(w: &[f64], u: f64) -> u32 {
    let total: f64 = w.iter().sum();
    if total <= 0.0 {
        return w.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32);
    }
    let target = u * total;
    let mut acc = 0.0;
    let mut last = 0;
    for (i, &x) in w.iter().enumerate() {
        if x > 0.0 {
            acc += x;
            last = i;
            if target < acc {
                return i as u32;
            }
        }
    }
    last as u32
}

/// Uniform draws in [0, 1) for the acceptance rule (splitmix64): seeded requests repeat.
pub struct Uniform(u64);

impl Uniform {
    pub fn new(seed: u64) -> Self {
        Uniform(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A loaded draft model.
pub(crate) struct DraftModel {
    pub(crate) dir: PathBuf,
    pub(crate) model: Box<dyn CausalLm>,
}

impl DraftModel {
    /// Loads the draft model at `path` (computing in `dtype`) for a model of `vocab` rows whose
    /// tokenizer is `tokenizer`: INVALID_ARGUMENT when their vocabularies differ.
    pub(crate) fn load(path: &str, dtype: Dtype, vocab: usize, tokenizer: Option<&Tokenizer>) -> Result<DraftModel> {
        let dir = resolve_model_path(path)?;
        let config = ModelConfig::from_dir(&dir)?;
        crate::models::check_config(&config)?;
        let bad = |why: String| Error::InvalidArgument(format!("draft model {}: {why}", dir.display()));
        if config.vocab_size > vocab {
            return Err(bad(format!("its vocabulary ({}) is larger than the model's ({vocab})", config.vocab_size)));
        }
        let own = if dir.join("tokenizer.json").is_file() { Some(Tokenizer::from_dir(&dir)?) } else { None };
        match (tokenizer, &own) {
            (Some(a), Some(b)) => {
                let n = a.vocab_size();
                if n != b.vocab_size() || (0..n as u32).any(|i| a.id_to_token(i) != b.id_to_token(i)) {
                    return Err(bad("its tokenizer's vocabulary differs from the model's (speculative decoding needs the same tokenizer)".into()));
                }
            }
            (None, None) if config.vocab_size == vocab => {}
            (None, None) => return Err(bad(format!("its vocabulary ({}) differs from the model's ({vocab})", config.vocab_size))),
            _ => return Err(bad("one of the two models has a tokenizer.json and the other none: their vocabularies cannot be compared".into())),
        }
        let mut weights = WeightStore::open(&dir)?;
        weights.compute_dtype = Some(dtype);
        let weights = RefCell::new(weights);
        let model = build_model(&config, &Vb::new(&weights, config.quantization.as_ref()))?;
        weights.into_inner().finish()?;
        let params = model.parameters();
        eval(&params)?;
        crate::generate::engine::weights_to_device(&params)?;
        drop(params);
        if model.make_caches().has_recurrent_state() {
            return Err(bad("its caches cannot be taken back (a recurrent state): it cannot draft".into()));
        }
        Ok(DraftModel { dir, model })
    }
}

/// The draft models an engine holds: the session's, and the last one a request named.
#[derive(Default)]
pub(crate) struct Drafts {
    pub(crate) session: Option<Rc<DraftModel>>,
    by_request: RefCell<Option<Rc<DraftModel>>>,
}

/// Where one request's drafts come from, and how many per pass.
pub(crate) enum Drafter {
    Lookup { max_ngram: usize },
    Model(Rc<DraftModel>),
}

impl Drafts {
    /// Whether `opts` asks for speculation (such requests run outside the continuous batch).
    pub(crate) fn requested(&self, opts: &GenerateOptions) -> bool {
        let k = opts.prompt_lookup.and_then(|p| p.num_draft_tokens).or(opts.num_draft_tokens);
        k != Some(0) && (opts.prompt_lookup.is_some() || opts.draft_model.is_some() || self.session.is_some())
    }

    /// The drafter of a request on `model` (None: plain decoding), loading a draft model it
    /// names. `constrained`: an output constraint is attached (it decodes plainly).
    pub(crate) fn plan(
        &self,
        opts: &GenerateOptions,
        model: &dyn CausalLm,
        tokenizer: Option<&Tokenizer>,
        constrained: bool,
    ) -> Result<Option<(Drafter, usize)>> {
        if !self.requested(opts) {
            return Ok(None);
        }
        let (drafter, k) = match (&opts.prompt_lookup, &opts.draft_model) {
            (Some(p), _) => (Drafter::Lookup { max_ngram: p.max_ngram }, p.num_draft_tokens.or(opts.num_draft_tokens)),
            (None, Some(path)) => {
                let mut slot = self.by_request.borrow_mut();
                let dir = resolve_model_path(path)?;
                let d = match slot.as_ref().filter(|d| d.dir == dir) {
                    Some(d) => d.clone(),
                    None => {
                        *slot = None;
                        let d = Rc::new(DraftModel::load(path, model.dtype(), model.vocab_size(), tokenizer)?);
                        *slot = Some(d.clone());
                        d
                    }
                };
                (Drafter::Model(d), opts.num_draft_tokens)
            }
            (None, None) => match &self.session {
                Some(d) => (Drafter::Model(d.clone()), opts.num_draft_tokens),
                None => return Ok(None),
            },
        };
        if constrained || opts.sampling.repetition_penalty != 1.0 || model.make_caches().has_recurrent_state() {
            return Ok(None);
        }
        Ok(Some((drafter, k.unwrap_or(DEFAULT_NUM_DRAFT_TOKENS))))
    }
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Forgets what `caches` (holding `held`) hold beyond `ctx` and its last token.
fn trim(caches: &mut LayerCaches, held: &mut Vec<u32>, ctx: &[u32]) -> Result<()> {
    let keep = common_prefix(held, ctx).min(ctx.len() - 1);
    if keep < held.len() {
        if !caches.can_trim_to(keep) {
            return Err(Error::Mlx(format!("speculative decoding: the cache cannot go back to {keep} tokens")));
        }
        caches.trim_to(keep)?;
        held.truncate(keep);
    }
    Ok(())
}

/// A draft model's side of a request: its caches (holding `held`) and its sampler.
struct DraftState<'a> {
    model: &'a dyn CausalLm,
    caches: LayerCaches,
    held: Vec<u32>,
    sampler: Sampler,
}

impl DraftState<'_> {
    /// Drafts `k` tokens after `ctx`, lazily: (tokens `[k]` uint32, with sampling their
    /// distributions `[k, V_draft]` float32).
    fn draft(&mut self, ctx: &[u32], k: usize, greedy: bool) -> Result<(Array, Option<Array>)> {
        let mut input = Array::from_slice(&ctx[self.held.len()..], &[1, (ctx.len() - self.held.len()) as i32])?;
        self.held = ctx.to_vec();
        let (mut tokens, mut dists) = (Vec::with_capacity(k), Vec::with_capacity(k));
        for j in 0..k {
            let logits = self.model.forward(&input, &mut self.caches)?;
            let l = logits.dim(1);
            let logits = logits.slice_axis(1, l - 1, l)?.reshape(&[1, -1])?;
            let lp = logits.subtract(&logits.logsumexp(&[-1], true)?)?;
            let t = if greedy {
                lp.argmax(-1, false)?.astype(Dtype::Uint32)?
            } else {
                let scaled = self.sampler.filtered(&lp)?;
                dists.push(scaled.softmax(-1, true)?.astype(Dtype::Float32)?);
                self.sampler.draw(&scaled)?
            };
            input = t.reshape(&[1, 1])?;
            tokens.push(t);
            if j + 1 < k {
                // Fed by the next iteration; the last draft is fed next pass, if accepted.
                self.held.push(u32::MAX);
            }
        }
        let tokens = Array::concatenate(&tokens.iter().collect::<Vec<_>>(), 0)?;
        let dists = if greedy { None } else { Some(Array::concatenate(&dists.iter().collect::<Vec<_>>(), 0)?) };
        Ok((tokens, dists))
    }
}

/// A verification pass's drafts: on the host (prompt lookup) or lazily on the device (a draft
/// model).
enum PassDrafts {
    Host(Vec<u32>),
    Device(Array),
}

impl PassDrafts {
    fn len(&self) -> usize {
        match self {
            PassDrafts::Host(h) => h.len(),
            PassDrafts::Device(d) => d.dim(0) as usize,
        }
    }
}

/// One verification pass, built and scheduled (`async_eval`), not yet read.
struct Pass {
    drafts: PassDrafts,
    /// The draft model's distributions at the drafts' positions (sampled requests).
    q: Option<Array>,
    /// Where its first input token sits in the caches (an index into `held`), and how many
    /// tokens it feeds.
    at: usize,
    fed: usize,
    /// Greedy: the model's token at each position `[rows]` uint32 and its logprob `[rows]`
    /// float32. Sampled: the distributions `p` `[rows, V]` and the logprobs `[rows, V]`, float32.
    verdict: (Array, Array),
    top: TopPending,
}

/// What a request's loop shares with the passes it builds and reads.
struct Verifier<'a> {
    model: &'a dyn CausalLm,
    greedy: bool,
    sampler: Sampler,
    uniform: Uniform,
    top_n: usize,
    vocab: usize,
}

impl Verifier<'_> {
    /// Feeds `pending` (uint32 `[P]`, on the host or the device) and the drafts after it, and
    /// schedules the verdict on the model's rows for the drafts and the token after them.
    /// `held` (what the caches hold) gains the fed tokens, `u32::MAX` for those not yet known.
    fn schedule(
        &self,
        caches: &mut LayerCaches,
        held: &mut Vec<u32>,
        pending: (Array, Option<&[u32]>),
        drafts: PassDrafts,
        q: Option<Array>,
        stats: &mut LoopStats,
    ) -> Result<Pass> {
        let (pending, known) = pending;
        let nd = drafts.len();
        let input = match &drafts {
            PassDrafts::Host(h) if h.is_empty() => pending,
            PassDrafts::Host(h) => Array::concatenate(&[&pending, &Array::from_slice(h, &[h.len() as i32])?], 0)?,
            PassDrafts::Device(d) => Array::concatenate(&[&pending, d], 0)?,
        };
        let l = input.dim(0);
        let at = held.len();
        match known {
            Some(k) => held.extend_from_slice(k),
            None => held.extend(std::iter::repeat_n(u32::MAX, l as usize - nd)),
        }
        match &drafts {
            PassDrafts::Host(h) => held.extend_from_slice(h),
            PassDrafts::Device(_) => held.extend(std::iter::repeat_n(u32::MAX, nd)),
        }
        let logits = self.model.forward(&input.reshape(&[1, l])?, caches)?;
        let rows = nd as i32 + 1;
        let logits = logits.slice_axis(1, l - rows, l)?.reshape(&[rows, -1])?;
        let lp = logits.subtract(&logits.logsumexp(&[-1], true)?)?;
        let top = TopPending::compute(&lp, &vec![self.top_n.min(self.vocab); rows as usize])?;
        let verdict = if self.greedy {
            let tok = lp.argmax(-1, false)?.astype(Dtype::Uint32)?;
            let tlp = lp.take_along_axis(&tok.reshape(&[rows, 1])?, -1)?.reshape(&[rows])?.astype(Dtype::Float32)?;
            (tok, tlp)
        } else {
            (self.sampler.filtered(&lp)?.softmax(-1, true)?.astype(Dtype::Float32)?, lp.astype(Dtype::Float32)?)
        };
        let mut arrays = vec![&verdict.0, &verdict.1];
        arrays.extend(top.arrays());
        if let PassDrafts::Device(d) = &drafts {
            arrays.push(d);
        }
        arrays.extend(q.as_ref());
        let t = Instant::now();
        async_eval(&arrays)?;
        stats.submit_s += t.elapsed().as_secs_f64();
        stats.steps_scheduled += 1;
        Ok(Pass { drafts, q, at, fed: l as usize, verdict, top })
    }

    /// Waits for `pass` and applies the acceptance rule: (its drafts, how many are kept, the
    /// model's token after them, the logprobs of the kept drafts and that token). `held` gets
    /// the drafts in place of their placeholders.
    fn read(&mut self, pass: &Pass, held: &mut [u32], stats: &mut LoopStats) -> Result<(Vec<u32>, usize, u32, Vec<f32>)> {
        let t = Instant::now();
        let drafts = match &pass.drafts {
            PassDrafts::Host(h) => h.clone(),
            PassDrafts::Device(d) => d.to_vec::<u32>()?,
        };
        let base = pass.at + pass.fed - drafts.len();
        held[base..base + drafts.len()].copy_from_slice(&drafts);
        let out = if self.greedy {
            let (tok, tlp) = (pass.verdict.0.to_vec::<u32>()?, pass.verdict.1.to_vec::<f32>()?);
            let m = common_prefix(&drafts, &tok);
            let next = tok[m];
            (drafts, m, next, tlp)
        } else {
            let (ph, lph) = (pass.verdict.0.to_vec::<f32>()?, pass.verdict.1.to_vec::<f32>()?);
            let qh = match &pass.q {
                Some(q) => Some((q.to_vec::<f32>()?, q.dim(-1) as usize)),
                None => None,
            };
            let uniform = &mut self.uniform;
            let (m, next) = accept(&drafts, &ph, qh.as_ref().map(|(q, vq)| (q.as_slice(), *vq)), self.vocab, &mut || uniform.next());
            let v = self.vocab;
            let logprobs = (0..=m).map(|i| lph[i * v + if i < m { drafts[i] } else { next } as usize]).collect();
            (drafts, m, next, logprobs)
        };
        stats.wait_s += t.elapsed().as_secs_f64();
        stats.verify_steps += 1;
        stats.drafted += out.0.len();
        stats.accepted += out.1;
        Ok(out)
    }
}

/// Generates from `prompt` as [`generator::run`] does (same callback contract: tokens handed
/// over in order, `max_tokens` enforced here, Stop/Force/Replace honoured), speculating with
/// `drafter`, `k` drafts per pass.
///
/// Greedy prompt lookup is pipelined (unless `MLEX_ABLATE_SPEC_PIPELINE` is set) while recent
/// passes kept all their drafts ([`GUESS_WHEN_KEPT`]): before a pass is read, the next one is
/// built as if every draft will be kept. It feeds the pass's last token, still on the device,
/// and drafts by looking up the context plus the pending drafts. The host encodes that pass
/// while the device runs the current one, as plain decoding overlaps its steps. When a draft is
/// rejected (or a callback changes the tokens) the guessed pass is dropped and the caches are
/// trimmed back.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    model: &dyn CausalLm,
    caches: &mut LayerCaches,
    drafter: &Drafter,
    k: usize,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(TokenStep) -> Result<Flow>,
) -> Result<LoopStats> {
    let cached = generator::prepare(model, caches, prompt, opts)?;
    let vocab = model.vocab_size();
    reset_peak_memory();
    let start = Instant::now();
    let mut pos = cached;
    while prompt.len() - pos > 1 {
        pos = generator::prefill_chunk(model, caches, prompt, pos, opts)?;
    }
    let seed = opts.sampling.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
    });
    let mut draft = match drafter {
        Drafter::Model(d) => {
            let mut dc = d.model.make_caches();
            let mut p = 0;
            while prompt.len() - p > 1 {
                p = generator::prefill_chunk(d.model.as_ref(), &mut dc, prompt, p, opts)?;
            }
            let cfg = SamplingConfig { seed: Some(seed.wrapping_add(1)), ..opts.sampling.clone() };
            Some(DraftState { model: d.model.as_ref(), caches: dc, held: prompt[..p].to_vec(), sampler: Sampler::new(&cfg)? })
        }
        Drafter::Lookup { .. } => None,
    };
    let greedy = opts.sampling.temperature == 0.0;
    let mut v = Verifier {
        model,
        greedy,
        sampler: Sampler::new(&SamplingConfig { seed: Some(seed), ..opts.sampling.clone() })?,
        uniform: Uniform::new(seed),
        top_n: opts.top_logprobs.unwrap_or(0),
        vocab,
    };
    let lookup_ngram = match drafter {
        Drafter::Lookup { max_ngram } => Some(*max_ngram),
        Drafter::Model(_) => None,
    };
    let pipelined = greedy && lookup_ngram.is_some() && !crate::ablation::get().spec_pipelining;

    let mut stats = LoopStats { prefilled: prompt.len() - cached, batch_size: 1, ..Default::default() };
    let mut ctx = prompt.to_vec();
    // What the caches hold, scheduled passes included (`u32::MAX`: a token still on the device).
    let mut held = prompt[..pos].to_vec();
    let mut inflight: Option<Pass> = None;
    // The moving share of passes that kept every draft (when a guess would have held).
    let mut kept_all = 1.0f64;
    let mut decode_start = None;
    let mut n = 0usize;
    while n < opts.max_tokens {
        let t0 = Instant::now();
        let pass = match inflight.take() {
            Some(p) => p,
            None => {
                let want = k.min(opts.max_tokens - n - 1);
                let (drafts, q) = match (&mut draft, lookup_ngram) {
                    (Some(d), _) if want > 0 => {
                        let (t, q) = d.draft(&ctx, want, greedy)?;
                        (PassDrafts::Device(t), q)
                    }
                    (None, Some(ng)) => (PassDrafts::Host(lookup(&ctx, ng, want)), None),
                    _ => (PassDrafts::Host(vec![]), None),
                };
                let pending = &ctx[held.len()..];
                let p = Array::from_slice(pending, &[pending.len() as i32])?;
                v.schedule(caches, &mut held, (p, Some(pending)), drafts, q, &mut stats)?
            }
        };
        // The next pass, guessed: this one's drafts all kept, its last row's token fed.
        let guess = match (&pass.drafts, lookup_ngram) {
            (PassDrafts::Host(d), Some(ng)) if pipelined && kept_all >= GUESS_WHEN_KEPT && n + d.len() + 1 < opts.max_tokens => {
                let want = k.min(opts.max_tokens - (n + d.len() + 1) - 1);
                let assumed = [&ctx[..], d].concat();
                let cont = lookup(&assumed, ng, want + 1);
                let drafts = PassDrafts::Host(cont.get(1..).unwrap_or_default().to_vec());
                let last = pass.verdict.0.slice_axis(0, d.len() as i32, d.len() as i32 + 1)?;
                Some(v.schedule(caches, &mut held, (last, None), drafts, None, &mut stats)?)
            }
            _ => None,
        };
        stats.schedule_s += t0.elapsed().as_secs_f64();
        let (drafts, m, next, logprobs) = v.read(&pass, &mut held, &mut stats)?;
        let nd = drafts.len();
        kept_all += GUESS_AVERAGE_WEIGHT * (f64::from(u8::from(m == nd)) - kept_all);
        if let Some(d) = draft.as_mut().filter(|_| matches!(pass.drafts, PassDrafts::Device(_)) && nd > 0) {
            // The drafts it fed itself (all but the last), in place of their placeholders.
            let base = d.held.len() - (nd - 1);
            d.held.truncate(base);
            d.held.extend_from_slice(&drafts[..nd - 1]);
        }
        let mut tops = pass.top.read()?.into_iter();
        let emitted = drafts[..m].iter().copied().chain(std::iter::once(next));
        let mut stop = false;
        for (id, logprob) in emitted.zip(logprobs) {
            if n >= opts.max_tokens {
                break;
            }
            if n == 0 {
                stats.ttft_s = start.elapsed().as_secs_f64();
                decode_start = Some(Instant::now());
            }
            n += 1;
            ctx.push(id);
            let top = tops.next().unwrap_or_default();
            let (forced, replace) = match on_token(TokenStep { id, logprob, forced: false, top })? {
                Flow::Continue => continue,
                Flow::Stop => {
                    stop = true;
                    break;
                }
                Flow::Force(t) => (t, false),
                Flow::Replace(t) => (t, true),
            };
            // The rest of this pass is dropped for the forced tokens.
            if replace {
                ctx.pop();
                n -= 1;
            }
            if let Some(bad) = forced.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::InvalidArgument(format!("forced token id {bad} is outside the vocabulary (size {vocab})")));
            }
            for t in forced {
                if n >= opts.max_tokens {
                    break;
                }
                n += 1;
                ctx.push(t);
                if on_token(TokenStep { id: t, logprob: 0.0, forced: true, top: vec![] })? == Flow::Stop {
                    stop = true;
                    break;
                }
            }
            break;
        }
        // The guess holds when the context is now exactly what it fed: every draft and the
        // model's token after them, nothing forced, nothing cut short.
        if let Some(g) = guess {
            let fed_at = g.at;
            if m == nd && !stop && ctx.len() == fed_at + 1 && ctx[fed_at] == next && ctx[..fed_at] == held[..fed_at] {
                held[fed_at] = next;
                inflight = Some(g);
                continue;
            }
            stats.dropped_passes += 1;
        }
        trim(caches, &mut held, &ctx)?;
        if let Some(d) = &mut draft {
            trim(&mut d.caches, &mut d.held, &ctx)?;
        }
        if stop {
            break;
        }
    }
    stats.generated = n;
    stats.decode_s = decode_start.map_or(0.0, |t| t.elapsed().as_secs_f64());
    stats.peak_memory = memory_stats().peak;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_proposes_what_followed_the_latest_occurrence_of_the_longest_ngram() {
        // "1 2 3 9 ... 1 2 3 7 8 ... 2 3" → the latest "2 3" was followed by 7 8.
        let ctx = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(lookup(&ctx, 3, 2), vec![7, 8]);
        assert_eq!(lookup(&ctx, 3, 10), vec![7, 8, 6, 2, 3]);
        // No 3-gram or 2-gram recurs: falls back to the last token.
        assert_eq!(lookup(&[4, 5, 6, 4], 3, 2), vec![5, 6]);
        assert_eq!(lookup(&[4, 5, 6], 3, 2), Vec::<u32>::new());
        assert_eq!(lookup(&[4, 4], 3, 0), Vec::<u32>::new());
    }

    /// Frequencies of the first token a pass emits over `n` passes, its draft drawn from `q`
    /// (a draft model) or fixed (`fixed`: prompt lookup, q a point mass on it).
    fn first_token_freq(fixed: Option<u32>, p: &[f32], q: &[f32], v: usize, n: usize) -> Vec<f64> {
        let mut u = Uniform::new(7);
        let mut counts = vec![0usize; v];
        for _ in 0..n {
            let (d, q) = match fixed {
                Some(d) => (d, None),
                None => (draw(&q.iter().map(|&x| x as f64).collect::<Vec<_>>(), u.next()), Some((q, v))),
            };
            let (m, next) = accept(&[d], p, q, v, &mut || u.next());
            counts[if m > 0 { d } else { next } as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / n as f64).collect()
    }

    #[test]
    fn accepted_or_resampled_tokens_follow_the_models_distribution() {
        let v = 4;
        // Two positions of the model's distribution (p), the draft model's (q).
        let p = [0.1, 0.5, 0.3, 0.1, 0.25, 0.25, 0.25, 0.25];
        let n = 200_000;
        for q in [[0.6, 0.1, 0.2, 0.1], [0.1, 0.5, 0.3, 0.1], [0.0, 0.0, 0.0, 1.0]] {
            for fixed in [None, Some(0), Some(1), Some(3)] {
                let f = first_token_freq(fixed, &p, &q, v, n);
                for t in 0..v {
                    assert!((f[t] - p[t] as f64).abs() < 0.005, "draft {fixed:?} q {q:?}: token {t} at {} (want {})", f[t], p[t]);
                }
            }
        }
        // A draft the model cannot produce is never accepted; a sure one always is.
        let mut u = Uniform::new(1);
        let p0 = [0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0];
        assert_eq!(accept(&[0], &p0, None, v, &mut || u.next()), (0, 1));
        assert_eq!(accept(&[1], &p0, None, v, &mut || u.next()), (1, 0));
    }
}
