//! Where a model lives: a directory, a Hugging Face hub cache entry, or a bare repo id looked up
//! under `MLEX_MODELS_DIR` (default `./models`) and the HF cache (`HF_HUB_CACHE`, `HF_HOME/hub`).
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Resolves a user's model argument to a directory holding `config.json`.
pub fn resolve_model_path(spec: &str) -> Result<PathBuf> {
    if spec.trim().is_empty() {
        return Err(Error::InvalidArgument("model path is empty".into()));
    }
    let direct = Path::new(spec);
    if direct.exists() {
        return resolve_dir(direct)
            .ok_or_else(|| Error::ModelNotFound(format!("{spec}: no config.json there (nor a hub cache snapshot)")));
    }
    let mut tried = vec![];
    for root in search_roots() {
        for cand in candidates(&root, spec) {
            if let Some(dir) = resolve_dir(&cand) {
                return Ok(dir);
            }
            tried.push(cand.display().to_string());
        }
    }
    Err(Error::ModelNotFound(format!("'{spec}' is not a directory, and no copy was found at: {}", tried.join(", "))))
}

/// A model directory itself, or a hub cache repo folder (`models--org--name`) resolved through
/// `refs/main` (else the only / newest snapshot).
fn resolve_dir(dir: &Path) -> Option<PathBuf> {
    if dir.join("config.json").is_file() {
        return Some(dir.to_path_buf());
    }
    let snapshots = dir.join("snapshots");
    if !snapshots.is_dir() {
        return None;
    }
    if let Ok(rev) = std::fs::read_to_string(dir.join("refs/main")) {
        let snap = snapshots.join(rev.trim());
        if snap.join("config.json").is_file() {
            return Some(snap);
        }
    }
    let mut snaps: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    snaps.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    snaps.pop()
}

fn search_roots() -> Vec<PathBuf> {
    let mut roots = vec![std::env::var_os("MLEX_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| "models".into())];
    if let Some(c) = std::env::var_os("HF_HUB_CACHE") {
        roots.push(c.into());
    }
    if let Some(h) = std::env::var_os("HF_HOME") {
        roots.push(PathBuf::from(h).join("hub"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(home).join(".cache/huggingface/hub"));
    }
    roots
}

fn candidates(root: &Path, spec: &str) -> Vec<PathBuf> {
    let mut out = vec![root.join(spec)];
    if let Some((org, name)) = spec.split_once('/') {
        out.push(root.join(format!("models--{org}--{name}")));
        out.push(root.join(name));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_cache_layout_resolves_through_refs_main() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("models--org--tiny");
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/old")).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        std::fs::write(repo.join("snapshots/abc123/config.json"), "{}").unwrap();
        std::fs::write(repo.join("snapshots/old/config.json"), "{}").unwrap();
        assert_eq!(resolve_dir(&repo).unwrap(), repo.join("snapshots/abc123"));
        let found = candidates(tmp.path(), "org/tiny").into_iter().find_map(|c| resolve_dir(&c)).unwrap();
        assert_eq!(found, repo.join("snapshots/abc123"));
    }

    #[test]
    fn missing_model_is_model_not_found() {
        let e = resolve_model_path("/definitely/not/here").unwrap_err();
        assert!(matches!(e, Error::ModelNotFound(_)), "{e}");
    }
}
