//! The reproduce flow end to end against the scripted server: lock a run, then
//! reproduce it (REPRODUCED), on a "different machine" (COMPATIBILITY_RUN), and
//! with a damaged model folder (refused before running).

use kestrel_bench::api::{ReproduceArgs, exit_code, reproduce};
use kestrel_bench::download::Source;
use kestrel_bench::env;
use kestrel_bench::lock::{LockedModel, ReleaseLock};
use kestrel_bench::manifest::Manifest;
use kestrel_bench::outcome::Outcome;
use kestrel_bench::profile::Profile;
use kestrel_bench::runner::{RunConfig, run_workload};

use super::scripted::{start_server, write_workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_then_reproduce() {
    let addr = start_server().await;
    let root = tempfile::tempdir().unwrap();
    let (workload, base) = write_workload(root.path(), "rounds = 3\nmodes = [\"cold\"]");
    let model_dir = root.path().join("model");
    std::fs::create_dir_all(&model_dir).unwrap();
    std::fs::write(model_dir.join("model.safetensors"), vec![7u8; 4096]).unwrap();
    let manifest = Manifest::from_dir(&model_dir, None, None).unwrap();

    let cfg = RunConfig {
        base_url: format!("http://{addr}"),
        model: None,
        api_key: None,
        workload: workload.clone(),
        workload_base: base,
        rounds: None,
    };
    let reference = run_workload(&cfg).await.unwrap();
    let environment = env::collect(None);
    let profile: Profile = toml::from_str(
        "schema_version = 1\nname = \"p\"\nprogram = \"kestrel\"\nargs = [\"serve\"]\n",
    )
    .unwrap();
    let model = LockedModel {
        repo: "Qwen/Test".into(),
        revision: "0123".into(),
        modelscope_repo: None,
        modelscope_revision: None,
        files: manifest.files,
    };
    let lock = ReleaseLock::from_run(
        "deadbeef",
        model,
        profile,
        "w.toml",
        workload,
        &reference,
        &environment,
    )
    .unwrap();
    let lock_path = root.path().join("lock.json");
    lock.save(&lock_path).unwrap();
    let loaded = ReleaseLock::load(&lock_path).unwrap();
    assert_eq!(loaded.prompt_sha256, reference.prompt_sha256);
    assert_eq!(loaded.machine_commitment, environment.machine_commitment);

    let args = |out: &str| ReproduceArgs {
        lock: lock_path.clone(),
        model_dir: model_dir.clone(),
        repo_root: root.path().to_path_buf(),
        download: false,
        source: Source::Auto,
        url: Some(format!("http://{addr}")),
        server_program: None,
        port: None,
        out: Some(root.path().join(out)),
    };

    let report = reproduce(&args("same")).await.unwrap();
    let c = report.classification.as_ref().unwrap();
    assert_eq!(
        c.outcome,
        Outcome::Reproduced,
        "{:?}\n{:?}",
        c.reasons,
        c.checks
    );
    assert_eq!(exit_code(c.outcome), 0);
    for f in [
        "summary.md",
        "result.json",
        "round-01.json",
        "round-03.json",
        "cold-ttft_s.svg",
        "cold-decode_tps.svg",
    ] {
        assert!(report.evidence_dir.join(f).exists(), "{f} missing");
    }
    let summary = std::fs::read_to_string(report.evidence_dir.join("summary.md")).unwrap();
    assert!(summary.contains("Outcome: REPRODUCED"), "{summary}");

    // Another machine: the fingerprint decides before any figure does.
    let mut other = loaded.clone();
    other.environment.gpu_name = Some("NVIDIA GB10".into());
    other.environment.gpu_count = 1;
    other.save(&lock_path).unwrap();
    let report = reproduce(&args("other")).await.unwrap();
    assert_eq!(
        report.classification.unwrap().outcome,
        Outcome::CompatibilityRun
    );

    // A damaged model file stops the run before it starts.
    loaded.save(&lock_path).unwrap();
    std::fs::write(model_dir.join("model.safetensors"), vec![8u8; 4096]).unwrap();
    let err = reproduce(&args("damaged")).await.unwrap_err().to_string();
    assert!(err.contains("corrupt: model.safetensors"), "{err}");
}
