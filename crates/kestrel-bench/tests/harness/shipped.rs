//! The workload and profile files shipped in bench/ load, and their pinned
//! prompt bytes still match the corpus.

use std::path::PathBuf;

use kestrel_bench::profile::Profile;
use kestrel_bench::workload::Workload;

fn bench_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../bench")
}

#[test]
fn shipped_workloads_load_and_match_their_prompt_hash() {
    let mut n = 0;
    for entry in std::fs::read_dir(bench_dir().join("workloads")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let (w, base) = Workload::load(&path).unwrap();
        assert!(
            w.prompt_sha256.is_some(),
            "{} pins no prompt hash",
            path.display()
        );
        let parts = w
            .build_parts(&base)
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        let chars = parts.base_prompt().chars().count() as f64;
        let approx_tokens = chars / w.chars_per_token;
        assert!(
            (approx_tokens / w.target_prompt_tokens as f64 - 1.0).abs() < 0.01,
            "{}",
            path.display()
        );
        n += 1;
    }
    assert!(
        n >= 4,
        "expected the 8K, 32K, 100K and stream-curve workloads"
    );
}

#[test]
fn shipped_profiles_load_and_render() {
    let mut n = 0;
    for entry in std::fs::read_dir(bench_dir().join("profiles")).unwrap() {
        let path = entry.unwrap().path();
        let p = Profile::load(&path).unwrap();
        let cmd = p
            .command_line(Some(std::path::Path::new("models/q")))
            .unwrap();
        assert!(
            cmd.contains("models/q") && cmd.contains(&p.port.to_string()),
            "{cmd}"
        );
        n += 1;
    }
    assert!(n >= 2);
}

#[test]
fn corpus_changes_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    std::fs::create_dir(&corpus).unwrap();
    std::fs::write(corpus.join("a.txt"), "def f():\n    return 1\n").unwrap();
    let mut w: Workload = toml::from_str(
        r#"schema_version = 1
name = "t"
target_prompt_tokens = 50
instruction = "Read."
question = "What?"
max_tokens = 4
[corpus]
dir = "corpus"
files = ["a.txt"]
"#,
    )
    .unwrap();
    let parts = w.build_parts(dir.path()).unwrap();
    w.prompt_sha256 = Some(parts.sha256());
    assert_eq!(w.build_parts(dir.path()).unwrap(), parts);
    std::fs::write(corpus.join("a.txt"), "def f():\n    return 2\n").unwrap();
    let err = w.build_parts(dir.path()).unwrap_err().to_string();
    assert!(err.contains("prompt bytes changed"), "{err}");
}
