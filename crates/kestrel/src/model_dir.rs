//! Which model folder a command runs on: the one given, or the bundled
//! default model, which is compiled into the binary so that kestrel works
//! offline on a fresh machine. Its DFlash drafter
//! (models/kestrel-tiny-qwen35-dflash) is compiled in the same way and is the
//! default drafter of `--speculative dflash` on the bundled model.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

const BUNDLED_NAME: &str = "kestrel-tiny-qwen35";
const BUNDLED_DRAFTER_NAME: &str = "kestrel-tiny-qwen35-dflash";

macro_rules! bundled_files {
    ($folder:literal: $($name:literal),* $(,)?) => {
        &[$(($name, include_bytes!(concat!("../../../models/", $folder, "/", $name)) as &[u8])),*]
    };
}

/// The bundled model's files (a Hugging Face folder: config, weights, tokenizer, template).
static BUNDLED: &[(&str, &[u8])] = bundled_files!(
    "kestrel-tiny-qwen35":
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

/// The bundled model's DFlash drafter (config and weights).
static BUNDLED_DRAFTER: &[(&str, &[u8])] = bundled_files!(
    "kestrel-tiny-qwen35-dflash":
    "config.json",
    "model.safetensors",
);

/// Writes the bundled model into the cache folder once (and again if a file
/// there was changed) and returns that folder.
pub fn bundled_dir() -> Result<PathBuf> {
    write_bundle(BUNDLED_NAME, BUNDLED)
}

/// The drafter `--speculative dflash` uses when no `--draft-model` is
/// given: the bundled drafter when the model is the bundled one (`model`
/// not given), written into the cache folder like the model; none for any
/// other model.
pub fn default_drafter(model: Option<&Path>) -> Result<Option<PathBuf>> {
    if model.is_some() {
        return Ok(None);
    }
    write_bundle(BUNDLED_DRAFTER_NAME, BUNDLED_DRAFTER).map(Some)
}

fn write_bundle(folder: &str, files: &[(&str, &[u8])]) -> Result<PathBuf> {
    let dir = cache_root().join("models").join(folder);
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create the model cache folder {}", dir.display()))?;
    for (name, bytes) in files {
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
    fn bundled_model_and_its_drafter_are_written_once_and_repaired() {
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

        // A model given by path has no default drafter; the bundled one has
        // the bundled drafter.
        let given = super::default_drafter(Some(&dir)).unwrap();
        assert_eq!(given, None);
        let default = super::default_drafter(None);
        let drafter = default.unwrap().expect("the bundled drafter");
        assert_eq!(
            drafter,
            root.path().join("models/kestrel-tiny-qwen35-dflash")
        );
        let config = kestrel_models::DflashConfig::from_file(&drafter.join("config.json"))
            .expect("the bundled drafter's config parses");
        assert!(config.block_size >= 2);
        assert!(drafter.join("model.safetensors").is_file());
    }
}
