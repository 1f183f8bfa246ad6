//! Which model folder a command runs on: the one given, or the bundled
//! default model, which is compiled into the binary so that kestrel works
//! offline on a fresh machine.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

const BUNDLED_NAME: &str = "kestrel-tiny-qwen35";

macro_rules! bundled_files {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_bytes!(concat!("../../../models/kestrel-tiny-qwen35/", $name)) as &[u8])),*]
    };
}

/// The bundled model's files (a Hugging Face folder: config, weights, tokenizer, template).
static BUNDLED: &[(&str, &[u8])] = bundled_files!(
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
);

/// The folder given on the command line; without one, the bundled model.
pub fn resolve(arg: Option<PathBuf>) -> Result<PathBuf> {
    match arg {
        Some(dir) if dir.is_dir() => Ok(dir),
        Some(dir) => bail!("model folder {} does not exist", dir.display()),
        None => bundled_dir(),
    }
}

/// Writes the bundled model into the cache folder once (and again if a file
/// there was changed) and returns that folder.
pub fn bundled_dir() -> Result<PathBuf> {
    let dir = cache_root().join("models").join(BUNDLED_NAME);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the model cache folder {}", dir.display()))?;
    for (name, bytes) in BUNDLED {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|on_disk| on_disk == *bytes) {
            continue;
        }
        write_atomically(&path, bytes)?;
    }
    Ok(dir)
}

/// `KESTREL_CACHE_DIR`, else `$XDG_CACHE_HOME/kestrel`, else `~/.cache/kestrel`,
/// else the system temporary folder.
fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("KESTREL_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("kestrel");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".cache").join("kestrel");
    }
    std::env::temp_dir().join("kestrel")
}

/// Concurrent first runs must never see a half-written file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn bundled_model_is_written_once_and_repaired() {
        let root = tempfile::tempdir().unwrap();
        // SAFETY: this is the only test in the binary that touches the environment.
        unsafe { std::env::set_var("KESTREL_CACHE_DIR", root.path()) };
        let dir = super::bundled_dir().unwrap();
        assert!(dir.join("model.safetensors").is_file());
        std::fs::write(dir.join("config.json"), b"{}").unwrap();
        let again = super::bundled_dir().unwrap();
        assert_eq!(dir, again);
        let config = std::fs::read(again.join("config.json")).unwrap();
        assert!(config.len() > 100, "a damaged file is rewritten");
    }
}
