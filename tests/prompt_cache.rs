//! The automatic prompt cache: greedy output with the pool equals greedy output without it (same
//! tokens, logprobs within 1e-5 on CPU f32), turn after turn, and `usage.cached_tokens` is exactly
//! what a model of the pool (`Mirror`) predicts: multi-turn transcripts, a system prompt shared by
//! unrelated conversations, edits in the middle of history, prompts that are strict prefixes of
//! cached entries, EOS fed by the pipelined step, concurrent calls, and eviction by max_entries,
//! TTL and max_bytes, min_cacheable_tokens, per-call bypass.
mod common;
use common::{edit_json, pseudo_random_prompt, TinyLlama, TINY_EOS};
use mlex::{ChatMessage, FinishReason, GenerateOptions, GenerateReply, LoadOptions, PromptCacheConfig, Session};
use std::time::Duration;

fn tiny_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { max_position_embeddings: 4096, ..Default::default() }.write(dir.path());
    dir
}

fn load(dir: &tempfile::TempDir, cache: PromptCacheConfig) -> Session {
    Session::load_with_options(dir.path(), LoadOptions { prompt_cache: cache, ..Default::default() }).unwrap()
}

fn off() -> PromptCacheConfig {
    PromptCacheConfig { max_entries: 0, ..Default::default() }
}

/// Greedy; `ignore_eos` so that runs have a known length.
fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, ..Default::default() }
}

fn chat_opts(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ..Default::default() }
}

fn bypass(mut o: GenerateOptions) -> GenerateOptions {
    o.prompt_cache = Some(false);
    o
}

#[track_caller]
fn assert_same(cached: &GenerateReply, cold: &GenerateReply) {
    assert_eq!(cached.tokens, cold.tokens, "tokens differ with the prompt cache");
    assert_eq!(cached.finish_reason, cold.finish_reason);
    assert_eq!(cached.text, cold.text);
    for (i, (a, b)) in cached.logprobs.iter().zip(&cold.logprobs).enumerate() {
        assert!((a - b).abs() <= 1e-5, "logprob {i}: {a} cached vs {b} cold");
    }
    assert_eq!(cold.usage.cached_tokens, 0);
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What the pool should hold (no eviction): the token sequences stored after each call.
struct Mirror {
    min: usize,
    entries: Vec<Vec<u32>>,
}

impl Mirror {
    fn new(min: usize) -> Self {
        Mirror { min: min.max(1), entries: vec![] }
    }

    /// The prompt tokens the pool should serve for `prompt`.
    fn expected(&self, prompt: &[u32]) -> usize {
        if prompt.len() < self.min {
            return 0;
        }
        let n = self.entries.iter().map(|e| common_prefix(e, prompt)).max().unwrap_or(0).min(prompt.len() - 1);
        if n < self.min {
            0
        } else {
            n
        }
    }

    /// Records the state a call leaves: the prompt and the tokens fed back by the pipelined loop
    /// (all but the last of a `length` run; every token and the EOS of a `stop` run).
    fn record(&mut self, prompt: &[u32], reply: &GenerateReply, eos: u32) {
        if prompt.len() < self.min {
            return;
        }
        let mut seq = prompt.to_vec();
        match reply.finish_reason {
            FinishReason::Length => seq.extend_from_slice(&reply.tokens[..reply.tokens.len().saturating_sub(1)]),
            FinishReason::Stop => {
                seq.extend_from_slice(&reply.tokens);
                seq.push(eos);
            }
            other => panic!("unexpected finish reason {other:?}"),
        }
        if self.entries.iter().any(|e| e.starts_with(&seq)) {
            return;
        }
        self.entries.retain(|e| !seq.starts_with(e));
        self.entries.push(seq);
    }

    /// Runs `prompt` on the pooled session and a cold reference, checks equivalence and
    /// `cached_tokens`, records the call; returns the reply.
    #[track_caller]
    fn check(&mut self, pooled: &Session, cold: &Session, prompt: &[u32], opts: GenerateOptions) -> GenerateReply {
        let want = self.expected(prompt);
        let a = pooled.generate_tokens(prompt, opts.clone(), |_| true).unwrap();
        let b = cold.generate_tokens(prompt, opts, |_| true).unwrap();
        assert_same(&a, &b);
        assert_eq!(a.usage.cached_tokens, want, "cached_tokens for a prompt of {} tokens", prompt.len());
        assert_eq!(a.usage.prompt_tokens, prompt.len());
        self.record(prompt, &a, TINY_EOS);
        a
    }
}

const SYSTEM: &str = "You are a terse assistant. Answer in one line.";

#[test]
fn multi_turn_transcript_reuses_the_previous_turn_and_equals_cold_output() {
    let dir = tiny_dir();
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let mut mirror = Mirror::new(8);
    let mut msgs = vec![ChatMessage::system(SYSTEM)];
    let questions = ["Hi there!", "What is 2+2?", "And in French?", "Thanks, bye."];
    for (turn, q) in questions.iter().enumerate() {
        msgs.push(ChatMessage::user(*q));
        let prompt = pooled.encode_messages(&msgs, None, None).unwrap();
        let reply = mirror.check(&pooled, &cold, &prompt, chat_opts(12));
        if turn > 0 {
            // At least the whole previous prompt came from the pool.
            assert!(reply.usage.cached_tokens > SYSTEM.len(), "turn {turn}: {}", reply.usage.cached_tokens);
        }
        msgs.push(ChatMessage::assistant(reply.text.clone()));
    }
}

#[test]
fn token_level_turns_reuse_exactly_the_fed_tokens() {
    let dir = tiny_dir();
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let mut mirror = Mirror::new(8);
    let mut prompt = pseudo_random_prompt(1, 30);
    for turn in 0..4 {
        let r = mirror.check(&pooled, &cold, &prompt, greedy(10));
        if turn > 0 {
            assert!(r.usage.cached_tokens > 0);
        }
        // Next turn: the whole reply (its last token was never fed: 9 of 10 are cached), then more.
        let before = prompt.len();
        prompt.extend_from_slice(&r.tokens);
        prompt.extend_from_slice(&pseudo_random_prompt(100 + turn, 7));
        assert_eq!(mirror.expected(&prompt), before + 9);
    }
}

#[test]
fn a_shared_system_prompt_is_reused_across_unrelated_conversations() {
    let dir = tiny_dir();
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let mut mirror = Mirror::new(8);
    let sys_only = pooled.encode_messages(&[ChatMessage::system(SYSTEM)], None, None).unwrap();
    for (i, q) in ["Tell me a joke.", "Where is Paris?", "Sum 3 and 4."].iter().enumerate() {
        let prompt = pooled.encode_messages(&[ChatMessage::system(SYSTEM), ChatMessage::user(*q)], None, None).unwrap();
        let r = mirror.check(&pooled, &cold, &prompt, chat_opts(8));
        if i > 0 {
            // The system message's tokens (minus the generation prompt that follows it) come from
            // the first conversation's entry.
            // (`sys_only` ends with the generation prompt: `<|im_start|>` and "assistant\n").
            assert!(r.usage.cached_tokens >= sys_only.len() - 11, "{} of {}", r.usage.cached_tokens, sys_only.len());
            assert!(r.usage.cached_tokens < prompt.len() - 5);
        }
    }
}

#[test]
fn an_edit_in_the_middle_of_history_reuses_up_to_the_edit() {
    let dir = tiny_dir();
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let mut mirror = Mirror::new(8);
    let mut msgs = vec![ChatMessage::system(SYSTEM), ChatMessage::user("My name is Ada and I like tea.")];
    let p1 = pooled.encode_messages(&msgs, None, None).unwrap();
    let r1 = mirror.check(&pooled, &cold, &p1, chat_opts(10));
    msgs.push(ChatMessage::assistant(r1.text.clone()));
    msgs.push(ChatMessage::user("What do I like?"));
    let p2 = pooled.encode_messages(&msgs, None, None).unwrap();
    mirror.check(&pooled, &cold, &p2, chat_opts(10));
    // The user rewrites their first message: everything after the edit must be recomputed.
    msgs[1] = ChatMessage::user("My name is Ada and I like coffee.");
    let p3 = pooled.encode_messages(&msgs, None, None).unwrap();
    let edit_at = common_prefix(&p2, &p3);
    assert!(edit_at > SYSTEM.len() && edit_at < p3.len() - 20);
    let r3 = mirror.check(&pooled, &cold, &p3, chat_opts(10));
    assert_eq!(r3.usage.cached_tokens, edit_at);
    // And the conversation goes on from the edited history.
    msgs.push(ChatMessage::assistant(r3.text.clone()));
    msgs.push(ChatMessage::user("Sure?"));
    let p4 = pooled.encode_messages(&msgs, None, None).unwrap();
    let r4 = mirror.check(&pooled, &cold, &p4, chat_opts(10));
    assert!(r4.usage.cached_tokens > p3.len() - 1);
}

#[test]
fn a_prompt_that_is_a_strict_prefix_of_an_entry_reuses_it_trimmed_and_leaves_it_intact() {
    let dir = tiny_dir();
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let mut mirror = Mirror::new(8);
    let long = pseudo_random_prompt(7, 40);
    let r = mirror.check(&pooled, &cold, &long, greedy(8));
    // A strict prefix: all but its last token (which must still be computed) come from the entry.
    let r_short = mirror.check(&pooled, &cold, &long[..20], greedy(8));
    assert_eq!(r_short.usage.cached_tokens, 19);
    // The same prompt again: everything but the last token.
    let r_again = mirror.check(&pooled, &cold, &long, greedy(8));
    assert_eq!(r_again.usage.cached_tokens, 39);
    assert_eq!(r_again.tokens, r.tokens);
    // The prompt plus exactly the fed tokens, then one more token.
    let mut ext = long.clone();
    ext.extend_from_slice(&r.tokens[..7]);
    assert_eq!(mirror.check(&pooled, &cold, &ext, greedy(8)).usage.cached_tokens, 46);
    ext.push(r.tokens[7]);
    ext.push(5);
    assert_eq!(mirror.check(&pooled, &cold, &ext, greedy(8)).usage.cached_tokens, 48);
    // A single generated token: nothing but the prompt is fed.
    let other = pseudo_random_prompt(8, 16);
    mirror.check(&pooled, &cold, &other, greedy(1));
    let mut next = other.clone();
    next.push(9);
    assert_eq!(mirror.check(&pooled, &cold, &next, greedy(4)).usage.cached_tokens, 16);
}

#[test]
fn an_eos_fed_by_the_pipelined_step_is_part_of_the_entry() {
    let dir = tiny_dir();
    let prompt = pseudo_random_prompt(11, 24);
    // Make a token the model emits greedily (the 5th) an EOS, so the run stops on it.
    let probe = load(&dir, off()).generate_tokens(&prompt, greedy(8), |_| true).unwrap();
    let eos = probe.tokens[4];
    let stop_at = probe.tokens.iter().position(|&t| t == eos || t == TINY_EOS).unwrap();
    edit_json(&dir.path().join("config.json"), |c| c["eos_token_id"] = serde_json::json!(eos));
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let opts = chat_opts(8);
    let a = pooled.generate_tokens(&prompt, opts.clone(), |_| true).unwrap();
    assert_eq!(a.finish_reason, FinishReason::Stop);
    assert_eq!(a.tokens, probe.tokens[..stop_at]);
    // Next prompt: the prompt, the reply, its EOS and more: all of it but the new part is cached.
    let mut next = prompt.clone();
    next.extend_from_slice(&probe.tokens[..=stop_at]);
    next.extend_from_slice(&[1, 2, 3]);
    let b = pooled.generate_tokens(&next, opts.clone(), |_| true).unwrap();
    assert_eq!(b.usage.cached_tokens, prompt.len() + stop_at + 1);
    assert_same(&b, &cold.generate_tokens(&next, opts, |_| true).unwrap());
}

#[test]
fn concurrent_conversations_equal_sequential_cold_ones() {
    let dir = tiny_dir();
    let pooled = load(&dir, PromptCacheConfig::default());
    let cold = load(&dir, off());
    let convo = |s: &Session, i: usize, opts: fn(usize) -> GenerateOptions| -> Vec<GenerateReply> {
        let mut msgs = vec![ChatMessage::system(SYSTEM)];
        let mut out = vec![];
        for t in 0..3 {
            msgs.push(ChatMessage::user(format!("Thread {i}, question {t}?")));
            let r = s.generate(&msgs, opts(8)).unwrap();
            msgs.push(ChatMessage::assistant(r.text.clone()));
            out.push(r);
        }
        out
    };
    let want: Vec<_> = (0..4).map(|i| convo(&cold, i, chat_opts)).collect();
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let s = pooled.clone();
            std::thread::spawn(move || convo(&s, i, chat_opts))
        })
        .collect();
    let got: Vec<Vec<GenerateReply>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (g, w) in got.iter().zip(&want) {
        for (t, (a, b)) in g.iter().zip(w).enumerate() {
            assert_same(a, b);
            if t > 0 {
                assert!(a.usage.cached_tokens > SYSTEM.len(), "turn {t} reused only {}", a.usage.cached_tokens);
            }
        }
    }
    // Per-call bypass on the pooled session gives the same as well.
    let bypassed = convo(&pooled, 2, |n| bypass(chat_opts(n)));
    for (a, b) in bypassed.iter().zip(&want[2]) {
        assert_same(b, a);
        assert_eq!(a.usage.cached_tokens, 0);
    }
}

#[test]
fn per_call_false_neither_reads_nor_writes_the_pool() {
    let dir = tiny_dir();
    let s = load(&dir, PromptCacheConfig::default());
    let p = pseudo_random_prompt(3, 20);
    let cached = |o: GenerateOptions| s.generate_tokens(&p, o, |_| true).unwrap().usage.cached_tokens;
    assert_eq!(cached(bypass(greedy(4))), 0);
    assert_eq!(cached(greedy(4)), 0, "the bypassed call must not have stored anything");
    assert_eq!(cached(greedy(4)), 19);
    assert_eq!(cached(bypass(greedy(4))), 0, "the bypassed call must not read the pool");
    assert_eq!(cached(GenerateOptions { prompt_cache: Some(true), ..greedy(4) }), 19);
    // A session with the pool off never reuses, whatever the call says.
    let off = load(&dir, off());
    let o = GenerateOptions { prompt_cache: Some(true), ..greedy(4) };
    off.generate_tokens(&p, o.clone(), |_| true).unwrap();
    assert_eq!(off.generate_tokens(&p, o, |_| true).unwrap().usage.cached_tokens, 0);
}

#[test]
fn min_cacheable_tokens_is_respected() {
    let dir = tiny_dir();
    let s = load(&dir, PromptCacheConfig { min_cacheable_tokens: 8, ..Default::default() });
    let cached = |p: &[u32]| s.generate_tokens(p, greedy(4), |_| true).unwrap();
    // Short prompts are neither stored nor looked up, even with their generated tokens.
    let short = pseudo_random_prompt(4, 6);
    let r = cached(&short);
    assert_eq!(cached(&short).usage.cached_tokens, 0);
    let mut ext = short.clone();
    ext.extend_from_slice(&r.tokens[..3]);
    ext.extend_from_slice(&[1, 2, 3]);
    assert_eq!(cached(&ext).usage.cached_tokens, 0, "a 6-token prompt's state must not be stored");
    // A long enough prompt is; a later prompt sharing fewer than 8 tokens does not reuse it.
    let long = pseudo_random_prompt(5, 12);
    assert_eq!(cached(&long).usage.cached_tokens, 0);
    let mut five = long[..5].to_vec();
    five.extend_from_slice(&[250, 251, 252, 253, 254, 255, 1]);
    assert_eq!(cached(&five).usage.cached_tokens, 0);
    let mut eight = long[..8].to_vec();
    eight.extend_from_slice(&[250, 251, 252, 253]);
    assert_eq!(cached(&eight).usage.cached_tokens, 8);
    // A short prompt that is a prefix of an entry is not looked up either.
    assert_eq!(cached(&long[..6]).usage.cached_tokens, 0);
}

#[test]
fn eviction_by_max_entries_is_least_recently_used() {
    let dir = tiny_dir();
    let s = load(&dir, PromptCacheConfig { max_entries: 2, ..Default::default() });
    let cached = |p: &[u32]| s.generate_tokens(p, greedy(3), |_| true).unwrap().usage.cached_tokens;
    // Distinct first tokens: no sharing between them.
    let [a, b, c] = [1u64, 2, 3].map(|i| {
        let mut p = pseudo_random_prompt(20 + i, 16);
        p[0] = 200 + i as u32;
        p
    });
    assert_eq!(cached(&a), 0);
    assert_eq!(cached(&b), 0);
    assert_eq!(cached(&a), 15); // a is now more recent than b
    assert_eq!(cached(&c), 0); // evicts b
    assert_eq!(cached(&a), 15);
    assert_eq!(cached(&c), 15);
    assert_eq!(cached(&b), 0, "b was evicted"); // evicts a
    assert_eq!(cached(&a), 0, "a was evicted");
}

#[test]
fn eviction_by_idle_ttl() {
    let dir = tiny_dir();
    let s = load(&dir, PromptCacheConfig { ttl: Duration::from_millis(400), ..Default::default() });
    let p = pseudo_random_prompt(30, 16);
    let q = pseudo_random_prompt(31, 16);
    let cached = |p: &[u32]| s.generate_tokens(p, greedy(3), |_| true).unwrap().usage.cached_tokens;
    assert_eq!(cached(&p), 0);
    assert_eq!(cached(&p), 15);
    std::thread::sleep(Duration::from_millis(900));
    assert_eq!(cached(&p), 0, "idle past the TTL: evicted");
    // Use refreshes: an entry used within the TTL stays.
    assert_eq!(cached(&q), 0);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(cached(&q), 15);
    }
}

#[test]
fn eviction_by_max_bytes_and_entries_larger_than_the_budget() {
    let dir = tiny_dir();
    // One entry of the tiny model (< 256 tokens): 2 layers × (K + V) × [1, 2 heads, 256, 8] f32.
    let entry = 2 * 2 * 2 * 256 * 8 * 4;
    let a = pseudo_random_prompt(40, 16);
    let mut b = pseudo_random_prompt(41, 16);
    b[0] = a[0] ^ 1;
    {
        let s = load(&dir, PromptCacheConfig { max_bytes: Some(entry + entry / 2), ..Default::default() });
        let cached = |p: &[u32]| s.generate_tokens(p, greedy(3), |_| true).unwrap().usage.cached_tokens;
        assert_eq!(cached(&a), 0);
        assert_eq!(cached(&a), 15);
        assert_eq!(cached(&b), 0); // storing b evicts a
        assert_eq!(cached(&b), 15);
        assert_eq!(cached(&a), 0, "a was evicted by the byte budget");
    }
    {
        let s = load(&dir, PromptCacheConfig { max_bytes: Some(entry - 1), ..Default::default() });
        let cached = |p: &[u32]| s.generate_tokens(p, greedy(3), |_| true).unwrap().usage.cached_tokens;
        assert_eq!(cached(&a), 0);
        assert_eq!(cached(&a), 0, "an entry larger than the whole budget is not stored");
    }
}

/// For the oracle-fixture tests below: a function that generates 8 greedy tokens from a prompt
/// with the pool and without it (prefill in chunks of `prefill_step`), asserts both equal, and
/// returns the pooled reply. None (skipped) without the oracle venv, outside CI.
fn fixture_runner(test: &str, family: &str, case: &str, prefill_step: usize) -> Option<impl Fn(&[u32]) -> GenerateReply> {
    common::require_oracle(test)?;
    // Prompts here run past the fixtures' max_position_embeddings (256): lift the context limit.
    let load = LoadOptions { context_length: Some(1 << 16), ..Default::default() };
    let session = Session::load_with_options(common::family_fixtures_dir(family).join(case), load).unwrap();
    let opts = move |cache: bool| {
        let mut o = greedy(8);
        o.prefill_step_size = prefill_step;
        o.prompt_cache = Some(cache);
        o
    };
    Some(move |prompt: &[u32]| {
        let cached = session.generate_tokens(prompt, opts(true), |_| true).unwrap();
        let cold = session.generate_tokens(prompt, opts(false), |_| true).unwrap();
        assert_same(&cached, &cold);
        cached
    })
}

/// Sliding-window layers keep only the keys a later query can see (gemma3's local layers, window 8
/// here, beside global ones): a turn that extends the previous one reuses it; a prompt that leaves
/// the cached transcript further back than the window's cache can be brought back to starts cold
/// (the pool skips that entry); one that leaves it a few tokens back reuses up to there. Every
/// reply equals the cold one. The prompts are long and prefilled in chunks of 64, so the window
/// caches have dropped old keys (positions 0..~190 are gone by the end of the first prompt).
#[test]
fn sliding_window_caches_reuse_what_they_can_and_equal_cold_output() {
    let Some(run) = fixture_runner("sliding_window_caches_reuse_what_they_can_and_equal_cold_output", "gemma3", "gemma3_text_f32", 64)
    else {
        return;
    };
    let first = pseudo_random_prompt(7, 400);
    let r1 = run(&first);
    assert_eq!(r1.usage.cached_tokens, 0);

    // The next turn: the whole first call (prompt + fed reply) comes from the pool.
    let mut second = first.clone();
    second.extend_from_slice(&r1.tokens);
    second.extend_from_slice(&pseudo_random_prompt(8, 5));
    let r2 = run(&second);
    assert!(r2.usage.cached_tokens >= first.len() + r1.tokens.len() - 1, "{}", r2.usage.cached_tokens);

    // Leaves the transcript at token 100: the window caches no longer hold what token 100 needs.
    let mut early = first[..100].to_vec();
    early.extend_from_slice(&pseudo_random_prompt(9, 20));
    assert_eq!(run(&early).usage.cached_tokens, 0);

    // Leaves it at token 390: within reach, reused up to there.
    let mut late = first[..390].to_vec();
    late.extend_from_slice(&pseudo_random_prompt(10, 20));
    assert_eq!(run(&late).usage.cached_tokens, 390);
}

/// A hybrid model (nemotron_h: Mamba2 layers keep a recurrent state that cannot be trimmed,
/// beside attention layers): turn 2 resumes from the whole of turn 1; a turn whose history differs
/// after turn 1's prompt (a re-rendered reply) resumes from the snapshot stored where that prompt
/// ended; a prompt that leaves the transcript inside turn 1's prompt starts cold. Every reply
/// equals the cold one.
#[test]
fn hybrid_recurrent_state_reuses_turns_and_snapshots_and_equals_cold_output() {
    let Some(run) = fixture_runner("hybrid_recurrent_state_reuses_turns_and_snapshots_and_equals_cold_output", "nemotron_h", "nemotron_h_f32", 16)
    else {
        return;
    };
    let first = pseudo_random_prompt(21, 40);
    let r1 = run(&first);
    assert_eq!(r1.usage.cached_tokens, 0);

    let mut second = first.clone();
    second.extend_from_slice(&r1.tokens);
    second.extend_from_slice(&pseudo_random_prompt(22, 6));
    let r2 = run(&second);
    assert!(r2.usage.cached_tokens >= first.len(), "turn 2 reused {} tokens", r2.usage.cached_tokens);

    // The same first prompt, then a different "reply": only the snapshot at the prompt's end fits.
    let mut rerendered = first.clone();
    rerendered.extend_from_slice(&pseudo_random_prompt(23, 10));
    assert_eq!(run(&rerendered).usage.cached_tokens, first.len() - 1);

    // Leaves the transcript at token 20: no stored state ends there.
    let mut early = first[..20].to_vec();
    early.extend_from_slice(&pseudo_random_prompt(24, 10));
    assert_eq!(run(&early).usage.cached_tokens, 0);
}
