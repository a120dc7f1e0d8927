//! The prompt cache on disk (`prompt_cache.dir`, CLI `--prompt-cache-dir`): a second process
//! (the built `mlex` CLI) reuses the prefix a first one computed, with greedy tokens identical to
//! a run without any cache; truncated, corrupt and foreign files are skipped, never trusted;
//! another model (other weights, another compute dtype, 8-bit activations) never reads the entries; the directory
//! stays within its byte bound, least recently used first; sliding-window and recurrent states
//! come back from disk intact (oracle fixtures, when the oracle venv is there).
mod common;
use common::{pseudo_random_prompt, TinyLlama};
use mlex::{GenerateOptions, GenerateReply, LoadOptions, PromptCacheConfig, Session};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tiny(seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    TinyLlama { max_position_embeddings: 4096, seed, ..Default::default() }.write(dir.path());
    dir
}

/// `shared` then a tail of its own.
fn with_tail(shared: &[u32], seed: u64, n: usize) -> Vec<u32> {
    let mut p = shared.to_vec();
    p.extend(pseudo_random_prompt(seed, n));
    p
}

/// One `mlex generate --json` process: its reply and its stderr.
fn cli(model: &Path, cache: Option<&Path>, prompt: &[u32], extra: &[&str]) -> (Value, String) {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlex"));
    cmd.args(["generate", "--device", "cpu", "--max-tokens", "8", "--ignore-eos", "--json", "--model"])
        .arg(model)
        .arg("--prompt-tokens")
        .arg(ids.join(","))
        .args(extra);
    if let Some(c) = cache {
        cmd.arg("--prompt-cache-dir").arg(c);
    }
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "mlex generate failed: {stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON reply in {stdout:?}"));
    (serde_json::from_str(line).unwrap(), stderr)
}

fn cached(v: &Value) -> u64 {
    v["cached_tokens"].as_u64().unwrap()
}

#[track_caller]
fn assert_same_reply(a: &Value, cold: &Value) {
    assert_eq!(a["tokens"], cold["tokens"], "tokens differ from the run without a cache");
    let (la, lc) = (a["logprobs"].as_array().unwrap(), cold["logprobs"].as_array().unwrap());
    for (i, (x, y)) in la.iter().zip(lc).enumerate() {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= 1e-4, "logprob {i}: {x} with the disk cache vs {y} cold");
    }
}

/// The prompt cache entries in `dir`, sorted.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("pc-") && p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_second_process_reuses_the_prefix_the_first_one_computed() {
    let model = tiny(1);
    let cache = tempfile::tempdir().unwrap();
    let shared = pseudo_random_prompt(1, 300);
    let (first, _) = cli(model.path(), Some(cache.path()), &with_tail(&shared, 2, 20), &[]);
    assert_eq!(cached(&first), 0);
    assert_eq!(entries(cache.path()).len(), 1, "the first process leaves its entry on disk");

    let second_prompt = with_tail(&shared, 3, 20);
    let (second, _) = cli(model.path(), Some(cache.path()), &second_prompt, &[]);
    let (cold, _) = cli(model.path(), None, &second_prompt, &[]);
    assert_eq!(cached(&second), 300, "the shared 300 tokens come from disk");
    assert_eq!(cached(&cold), 0);
    assert_same_reply(&second, &cold);
    // The usage block says the same.
    assert_eq!(second["usage"]["cached_tokens"].as_u64(), Some(300));
}

#[test]
fn truncated_corrupt_and_foreign_files_are_skipped() {
    let model = tiny(1);
    let cache = tempfile::tempdir().unwrap();
    let shared = pseudo_random_prompt(4, 200);
    cli(model.path(), Some(cache.path()), &with_tail(&shared, 5, 10), &[]);
    let entry = entries(cache.path()).pop().unwrap();
    let name = entry.file_name().unwrap().to_string_lossy().into_owned();
    // Truncate the real entry; add garbage under this model's prefix, another model's name and
    // a file that is no entry at all.
    let bytes = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &bytes[..bytes.len() / 2]).unwrap();
    let prefix = &name[..name.len() - "0123456789abcdef.safetensors".len()];
    std::fs::write(cache.path().join(format!("{prefix}ffffffffffffffff.safetensors")), b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all").unwrap();
    std::fs::write(cache.path().join("pc-0000000000000000-0000000000000000.safetensors"), &bytes[..100]).unwrap();
    std::fs::write(cache.path().join("notes.txt"), b"not mine").unwrap();

    let prompt = with_tail(&shared, 6, 10);
    let (r, stderr) = cli(model.path(), Some(cache.path()), &prompt, &[]);
    let (cold, _) = cli(model.path(), None, &prompt, &[]);
    assert_eq!(cached(&r), 0, "nothing usable on disk");
    assert_same_reply(&r, &cold);
    assert!(stderr.contains("prompt cache on disk: skipping"), "a warning names the bad files: {stderr}");
    assert!(cache.path().join("notes.txt").exists(), "files that are not entries are left alone");
    // The run wrote a good entry of its own, which the next process uses.
    let (again, _) = cli(model.path(), Some(cache.path()), &with_tail(&shared, 7, 10), &[]);
    assert_eq!(cached(&again), 200);
}

#[test]
fn another_model_or_dtype_never_reads_the_entries() {
    let (a, b) = (tiny(1), tiny(2));
    let cache = tempfile::tempdir().unwrap();
    let shared = pseudo_random_prompt(8, 200);
    cli(a.path(), Some(cache.path()), &with_tail(&shared, 9, 10), &[]);
    let prompt = with_tail(&shared, 10, 10);
    // Same config.json and tokenizer, other weights.
    let (other, _) = cli(b.path(), Some(cache.path()), &prompt, &[]);
    let (other_cold, _) = cli(b.path(), None, &prompt, &[]);
    assert_eq!(cached(&other), 0);
    assert_same_reply(&other, &other_cold);
    // Same weights, another compute dtype.
    let (f16, _) = cli(a.path(), Some(cache.path()), &prompt, &["--dtype", "float16"]);
    assert_eq!(cached(&f16), 0);
    // Same weights, 8-bit activations (other numerics on CPUs with VNNI: never shared).
    let (int8, _) = cli(a.path(), Some(cache.path()), &prompt, &["--int8-activations"]);
    assert_eq!(cached(&int8), 0);
    // Each wrote an entry of its own; the first model still finds its own.
    assert_eq!(entries(cache.path()).len(), 4);
    assert_eq!(cached(&cli(a.path(), Some(cache.path()), &prompt, &[]).0), 200);
}

fn disk_session(model: &Path, cache: &Path, disk_max_bytes: u64) -> Session {
    let prompt_cache = PromptCacheConfig { dir: Some(cache.to_path_buf()), disk_max_bytes, ..Default::default() };
    Session::load_with_options(model, LoadOptions { prompt_cache, ..Default::default() }).unwrap()
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, ..Default::default() }
}

/// One call in a session of its own (dropping it waits for its disk writes).
fn run_once(model: &Path, cache: &Path, bound: u64, prompt: &[u32]) -> GenerateReply {
    let s = disk_session(model, cache, bound);
    s.generate_tokens(prompt, greedy(4), |_| true).unwrap()
}

/// `Session::end_for_exit` (how the CLI ends: the model's memory is left to the OS) still lets
/// the queued disk writes finish, and with another clone alive it only drops its own handle.
#[test]
fn ending_for_exit_still_writes_the_entries() {
    let model = tiny(1);
    let cache = tempfile::tempdir().unwrap();
    let shared = pseudo_random_prompt(1, 300);
    let s = disk_session(model.path(), cache.path(), 1 << 30);
    s.generate_tokens(&with_tail(&shared, 2, 20), greedy(4), |_| true).unwrap();
    let other = s.clone();
    s.end_for_exit();
    let again = other.generate_tokens(&with_tail(&shared, 4, 20), greedy(4), |_| true).unwrap();
    assert_eq!(again.usage.cached_tokens, 300, "the clone still serves, from the memory pool");
    other.end_for_exit();
    assert!(!entries(cache.path()).is_empty(), "the entries are on disk once the session ended");
    let reply = run_once(model.path(), cache.path(), 1 << 30, &with_tail(&shared, 3, 20));
    assert_eq!(reply.usage.cached_tokens, 300, "a new session reads them");
}

#[test]
fn the_directory_keeps_to_its_byte_bound_least_recently_used_first() {
    let model = tiny(1);
    let cache = tempfile::tempdir().unwrap();
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| {
        let mut p = pseudo_random_prompt(20 + i, 64);
        p[0] = 250 + i as u32; // nothing shared between them
        p
    }).collect();
    run_once(model.path(), cache.path(), 1 << 30, &prompts[0]);
    let size = std::fs::metadata(&entries(cache.path())[0]).unwrap().len();
    // Room for two entries, not three.
    let bound = size * 5 / 2;
    let pause = || std::thread::sleep(std::time::Duration::from_millis(30));
    pause();
    run_once(model.path(), cache.path(), bound, &prompts[1]);
    assert_eq!(entries(cache.path()).len(), 2);
    pause();
    // Reading the first entry makes it the most recently used: the second goes next.
    assert_eq!(run_once(model.path(), cache.path(), bound, &prompts[0]).usage.cached_tokens, 63);
    pause();
    run_once(model.path(), cache.path(), bound, &prompts[2]);
    assert_eq!(entries(cache.path()).len(), 2);
    assert!(mlex::generate::prompt_disk::dir_bytes(cache.path()) <= bound);
    assert_eq!(run_once(model.path(), cache.path(), bound, &prompts[0]).usage.cached_tokens, 63, "the recently read entry stays");
    assert_eq!(run_once(model.path(), cache.path(), bound, &prompts[1]).usage.cached_tokens, 0, "the least recently used went");
    // An entry larger than the whole bound is not written at all.
    let tiny_bound = size / 2;
    let lone = tempfile::tempdir().unwrap();
    run_once(model.path(), lone.path(), tiny_bound, &prompts[0]);
    assert!(entries(lone.path()).is_empty());
}

#[test]
fn a_turn_that_extends_an_entry_replaces_its_file() {
    let model = tiny(1);
    let cache = tempfile::tempdir().unwrap();
    let s = disk_session(model.path(), cache.path(), 1 << 30);
    let first = pseudo_random_prompt(30, 40);
    let r1 = s.generate_tokens(&first, greedy(4), |_| true).unwrap();
    // The writer thread renames the file into place in the background.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while entries(cache.path()).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut second = first.clone();
    second.extend(&r1.tokens);
    second.extend(pseudo_random_prompt(31, 5));
    assert!(s.generate_tokens(&second, greedy(4), |_| true).unwrap().usage.cached_tokens >= first.len());
    drop(s);
    assert_eq!(entries(cache.path()).len(), 1, "the longer entry supersedes the one it extends");
    // A fresh session (nothing in memory) resumes the whole transcript from disk.
    let mut third = second.clone();
    third.extend(pseudo_random_prompt(32, 5));
    let r3 = run_once(model.path(), cache.path(), 1 << 30, &third);
    assert!(r3.usage.cached_tokens >= second.len(), "{} cached", r3.usage.cached_tokens);
    let cold = Session::load_with_options(model.path(), LoadOptions::default()).unwrap();
    let mut o = greedy(4);
    o.prompt_cache = Some(false);
    assert_eq!(r3.tokens, cold.generate_tokens(&third, o, |_| true).unwrap().tokens);
}

#[test]
fn a_bad_directory_fails_the_load_naming_it() {
    let model = tiny(1);
    let file = tempfile::NamedTempFile::new().unwrap();
    let under_a_file = file.path().join("cache");
    let prompt_cache = PromptCacheConfig { dir: Some(under_a_file.clone()), ..Default::default() };
    let err = Session::load_with_options(model.path(), LoadOptions { prompt_cache, ..Default::default() }).err().expect("load must fail");
    assert!(err.to_string().contains(&under_a_file.display().to_string()), "{err}");
}

/// Loads an oracle fixture twice (two sessions, so the second has nothing in memory) over one
/// cache directory; returns a runner: each call loads a fresh session (nothing in memory),
/// checks its reply equals the cold one, and returns it.
fn fixture_pair(test: &str, family: &str, case: &str, prefill_step: usize) -> Option<impl Fn(&[u32]) -> GenerateReply> {
    common::require_oracle(test)?;
    let model = common::family_fixtures_dir(family).join(case);
    let cache = tempfile::tempdir().unwrap();
    Some(move |prompt: &[u32]| {
        let prompt_cache = PromptCacheConfig { dir: Some(cache.path().to_path_buf()), ..Default::default() };
        let load = LoadOptions { context_length: Some(1 << 16), prompt_cache, ..Default::default() };
        let s = Session::load_with_options(&model, load).unwrap();
        let mut o = greedy(8);
        o.prefill_step_size = prefill_step;
        o.prompt_cache = Some(false);
        let cold = s.generate_tokens(prompt, o.clone(), |_| true).unwrap();
        o.prompt_cache = Some(true);
        let r = s.generate_tokens(prompt, o, |_| true).unwrap();
        assert_eq!(r.tokens, cold.tokens, "tokens differ with the disk cache");
        for (a, b) in r.logprobs.iter().zip(&cold.logprobs) {
            assert!((a - b).abs() <= 1e-5, "logprob {a} with the disk cache vs {b} cold");
        }
        r
    })
}

#[test]
fn sliding_window_and_recurrent_states_come_back_from_disk() {
    // gemma3: sliding-window layers (window 8) beside global ones; the window caches dropped the
    // oldest keys, and the saved state keeps exactly what they held.
    if let Some(run) = fixture_pair("sliding_window_and_recurrent_states_come_back_from_disk", "gemma3", "gemma3_text_f32", 64) {
        let first = pseudo_random_prompt(7, 400);
        let r1 = run(&first);
        assert_eq!(r1.usage.cached_tokens, 0);
        let mut second = first.clone();
        second.extend(&r1.tokens);
        second.extend(pseudo_random_prompt(8, 5));
        let r2 = run(&second);
        assert!(r2.usage.cached_tokens >= first.len() + r1.tokens.len() - 1, "{}", r2.usage.cached_tokens);
        // Leaving the transcript further back than the windows reach: nothing usable.
        let mut early = first[..100].to_vec();
        early.extend(pseudo_random_prompt(9, 20));
        assert_eq!(run(&early).usage.cached_tokens, 0);
    }
    // nemotron_h: Mamba2 recurrent states; an entry serves only prompts that extend all of it,
    // and the snapshot at the prompt's end is on disk too.
    if let Some(run) = fixture_pair("sliding_window_and_recurrent_states_come_back_from_disk", "nemotron_h", "nemotron_h_f32", 16) {
        let first = pseudo_random_prompt(21, 40);
        let r1 = run(&first);
        let mut second = first.clone();
        second.extend(&r1.tokens);
        second.extend(pseudo_random_prompt(22, 6));
        let r2 = run(&second);
        assert!(r2.usage.cached_tokens >= first.len(), "turn 2 reused {} tokens", r2.usage.cached_tokens);
        let mut rerendered = first.clone();
        rerendered.extend(pseudo_random_prompt(23, 10));
        assert_eq!(run(&rerendered).usage.cached_tokens, first.len() - 1);
        let mut early = first[..20].to_vec();
        early.extend(pseudo_random_prompt(24, 10));
        assert_eq!(run(&early).usage.cached_tokens, 0);
    }
}

#[test]
fn processes_sharing_the_directory_at_once_leave_only_whole_entries() {
    let model = tiny(1);
    let cache = tempfile::tempdir().unwrap();
    let shared = pseudo_random_prompt(40, 200);
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..3u64)
            .map(|i| {
                let (model, cache, shared) = (model.path(), cache.path(), &shared);
                s.spawn(move || cli(model, Some(cache), &with_tail(shared, 41 + i, 10), &[]))
            })
            .collect();
        for r in runs {
            let (reply, stderr) = r.join().unwrap();
            assert!(!stderr.contains("skipping"), "{stderr}");
            // Each may or may not find another's entry, depending on who finished first.
            assert!(cached(&reply) == 0 || cached(&reply) >= 200, "{}", cached(&reply));
        }
    });
    let names: Vec<String> = std::fs::read_dir(cache.path()).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.starts_with(".tmp")), "temporary files left: {names:?}");
    let (r, stderr) = cli(model.path(), Some(cache.path()), &with_tail(&shared, 50, 10), &[]);
    // The shared 200 tokens (a tail may share its first token or so by chance).
    assert!((200..205).contains(&cached(&r)), "{}", cached(&r));
    assert!(!stderr.contains("skipping"), "{stderr}");
}
