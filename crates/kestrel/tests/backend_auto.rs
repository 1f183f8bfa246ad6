//! The README's first command, `kestrel generate --prompt ...` with no
//! backend named, runs anywhere: on the GPU when one opens, else on the CPU
//! with one line on stderr saying so.

use std::process::Command;

#[test]
fn default_backend_runs_the_readme_command() {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args([
            "generate",
            "--max-tokens",
            "2",
            "--prompt",
            "def fibonacci(n):",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    if stderr.contains("on cuda:0") {
        // A machine with a GPU and the compiled kernels: auto took it.
        assert!(!stderr.contains("running on the CPU"), "{stderr}");
        return;
    }
    let notes: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("running on the CPU"))
        .collect();
    assert_eq!(notes.len(), 1, "one fallback note: {stderr}");
    assert!(
        notes[0].starts_with("kestrel: running on the CPU (--backend auto: "),
        "{stderr}"
    );
    assert!(stderr.contains(" on cpu"), "{stderr}");
}
