//! Skips that say so. Rust tests have no runtime skip: a test that cannot run what it is for
//! (assets or a venv absent) calls [`skip`], which prints `SKIPPED: <test>: <reason>` and appends
//! that line to [`skip_log`], printed by scripts/test.sh after the run, so a skip never reads as a
//! pass in 0.00 s; [`skip_unless_ci`] for what CI sets up itself, where it is a failure instead.
#![allow(dead_code)]
use std::path::PathBuf;

/// True when running in CI (`$CI` set to anything but "", "0" or "false").
fn ci() -> bool {
    std::env::var("CI").map(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false")).unwrap_or(false)
}

/// Where skips are recorded: `$MLEX_SKIP_LOG` (scripts/test.sh sets it), else
/// `<target>/skipped-tests.log` (found from the test binary's path, `<target>/<profile>/deps/`).
pub fn skip_log() -> PathBuf {
    if let Some(p) = std::env::var_os("MLEX_SKIP_LOG").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let target = exe
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "deps"))
        .and_then(|deps| deps.parent()?.parent().map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("skipped-tests.log")
}

/// Records that `test` did not run what it is for: prints `SKIPPED: <test>: <reason>` (shown
/// with --nocapture) and appends the line to [`skip_log`].
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let line = format!("SKIPPED: {test}: {reason}");
    println!("{line}");
    eprintln!("{line}");
    let log = skip_log();
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
        let _ = writeln!(f, "{line}");
    }
}

/// [`skip`] for what CI sets up itself (the oracle venv, the fetched test assets): under CI
/// (`CI=1`) this is a failure, never a skip.
#[track_caller]
pub fn skip_unless_ci(test: &str, reason: &str) {
    if ci() {
        panic!("{test}: {reason}; CI is set, so this is a failure, not a skip");
    }
    skip(test, reason);
}
