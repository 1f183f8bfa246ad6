//! Which model folder a command runs on.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// The folder given on the command line; without one, the bundled model.
pub fn resolve(arg: Option<PathBuf>) -> Result<PathBuf> {
    match arg {
        Some(dir) if dir.is_dir() => Ok(dir),
        Some(dir) => bail!("model folder {} does not exist", dir.display()),
        None => bail!("no --model given and this build has no bundled model"),
    }
}
