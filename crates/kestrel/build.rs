//! The bundled DFlash drafter is compiled in when its folder is in the
//! checkout (models/kestrel-tiny-qwen35-dflash: config.json and
//! model.safetensors, written by scripts/bundled_model/train_dflash.py).
//! Without it kestrel still builds, and `--speculative dflash` on the
//! bundled model asks for `--draft-model`.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(bundled_dflash)");
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    // The whole folder is watched (cargo compares the newest mtime under
    // it): a path that does not exist yet would rerun this on every build.
    println!("cargo::rerun-if-changed={}", models.display());
    let dir = models.join("kestrel-tiny-qwen35-dflash");
    let files = ["config.json", "model.safetensors"];
    if files.iter().all(|name| dir.join(name).is_file()) {
        println!("cargo::rustc-cfg=bundled_dflash");
    }
}
