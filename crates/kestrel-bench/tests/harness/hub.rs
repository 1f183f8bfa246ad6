//! A local model hub that speaks the Hugging Face and ModelScope download
//! protocols (file listing, resolve URLs, HTTP Range), with a switch to cut a
//! transfer halfway, and tests for manifests and resumable downloads.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use sha2::{Digest, Sha256};

use kestrel_bench::download::{DownloadRequest, Endpoints, HubKind, PARTIAL_DIR, Source, download};
use kestrel_bench::manifest::{FileStatus, Manifest, verify_dir};

#[derive(Default)]
pub struct Hub {
    files: BTreeMap<String, Vec<u8>>,
    /// Paths whose next full or ranged transfer stops halfway.
    cut_next: Mutex<HashSet<String>>,
    /// Every file request: (path, Range header).
    log: Mutex<Vec<(String, Option<String>)>>,
    /// Answer 503 to everything (a hub that is down).
    down: bool,
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

async fn hf_list(
    State(h): State<Arc<Hub>>,
    UrlPath((_o, _n, _rev)): UrlPath<(String, String, String)>,
) -> Response {
    if h.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let siblings: Vec<_> = h
        .files
        .iter()
        .map(|(p, d)| {
            if p.ends_with(".json") {
                json!({"rfilename": p, "size": d.len()})
            } else {
                json!({"rfilename": p, "size": d.len(), "lfs": {"sha256": sha(d), "size": d.len()}})
            }
        })
        .collect();
    axum::Json(json!({"sha": "abc", "siblings": siblings})).into_response()
}

async fn ms_list(
    State(h): State<Arc<Hub>>,
    UrlPath((_o, _n)): UrlPath<(String, String)>,
) -> Response {
    if h.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let files: Vec<_> = h
        .files
        .iter()
        .map(|(p, d)| json!({"Path": p, "Name": p, "Type": "blob", "Size": d.len(), "Sha256": sha(d)}))
        .collect();
    axum::Json(json!({"Code": 200, "Data": {"Files": files}})).into_response()
}

async fn file(
    State(h): State<Arc<Hub>>,
    UrlPath((_o, _n, _rev, path)): UrlPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    h.log.lock().unwrap().push((path.clone(), range.clone()));
    if h.down {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let Some(data) = h.files.get(&path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let len = data.len();
    let start = match range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
    {
        Some(s) => s.parse::<usize>().unwrap(),
        None => 0,
    };
    if start >= len && range.is_some() {
        return (
            StatusCode::RANGE_NOT_SATISFIABLE,
            [(header::CONTENT_RANGE, format!("bytes */{len}"))],
        )
            .into_response();
    }
    let rest = Bytes::copy_from_slice(&data[start..]);
    let cut = h.cut_next.lock().unwrap().remove(&path);
    let body = if cut {
        // Send half of what is left, give it time to reach the client, then break the connection.
        let half = rest.slice(..rest.len() / 2);
        Body::from_stream(futures_util::stream::unfold(0u8, move |step| {
            let half = half.clone();
            async move {
                match step {
                    0 => Some((Ok(half), 1)),
                    1 => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Some((Err(std::io::Error::other("connection cut")), 2))
                    }
                    _ => None,
                }
            }
        }))
    } else {
        Body::from(rest)
    };
    let mut resp = body.into_response();
    if range.is_some() {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        resp.headers_mut().insert(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{len}", len - 1).parse().unwrap(),
        );
    }
    resp
}

pub async fn start_hub(hub: Hub) -> (SocketAddr, Arc<Hub>) {
    let hub = Arc::new(hub);
    let app = Router::new()
        .route("/api/models/{owner}/{name}/revision/{rev}", get(hf_list))
        .route("/{owner}/{name}/resolve/{rev}/{*path}", get(file))
        .route("/api/v1/models/{owner}/{name}/repo/files", get(ms_list))
        .route("/models/{owner}/{name}/resolve/{rev}/{*path}", get(file))
        .with_state(hub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, hub)
}

/// A Hugging Face hub serving `files` (its address and state) and a
/// ModelScope that is down (its address).
async fn hf_hub_with_modelscope_down(
    files: BTreeMap<String, Vec<u8>>,
) -> (SocketAddr, Arc<Hub>, SocketAddr) {
    let (hf, hub) = start_hub(Hub {
        files,
        ..Default::default()
    })
    .await;
    let (ms, _) = start_hub(Hub {
        down: true,
        ..Default::default()
    })
    .await;
    (hf, hub, ms)
}

fn model_files() -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    m.insert(
        "config.json".to_string(),
        br#"{"model_type": "qwen3"}"#.to_vec(),
    );
    m.insert(
        "model-00001-of-00002.safetensors".to_string(),
        (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect(),
    );
    m.insert(
        "model-00002-of-00002.safetensors".to_string(),
        (0..200_000u32).map(|i| (i * 13 % 241) as u8).collect(),
    );
    m.insert(
        "sub/tokenizer.json".to_string(),
        b"{\"vocab\": {}}".to_vec(),
    );
    m
}

fn write_all(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (p, d) in files {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, d).unwrap();
    }
}

fn request(
    dest: &Path,
    hf: SocketAddr,
    ms: SocketAddr,
    manifest: Option<Manifest>,
    source: Source,
    attempts: u32,
) -> DownloadRequest {
    DownloadRequest {
        repo: "Qwen/Test".into(),
        revision: "0123abcd".into(),
        modelscope_repo: None,
        modelscope_revision: Some("master".into()),
        dest: dest.to_path_buf(),
        source,
        endpoints: Endpoints {
            huggingface: format!("http://{hf}"),
            modelscope: format!("http://{ms}"),
        },
        manifest,
        attempts,
        show_progress: false,
    }
}

fn reference_manifest() -> Manifest {
    let src = tempfile::tempdir().unwrap();
    write_all(src.path(), &model_files());
    Manifest::from_dir(
        src.path(),
        Some("Qwen/Test".into()),
        Some("0123abcd".into()),
    )
    .unwrap()
}

#[test]
fn verify_reports_each_problem_distinctly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut files = model_files();
    files.insert("a.bin".into(), vec![1; 1000]);
    files.insert("b.bin".into(), vec![2; 1000]);
    write_all(d, &files);
    let m = Manifest::from_dir(d, None, None).unwrap();
    assert_eq!(m.files.len(), 6);
    assert!(verify_dir(d, &m).unwrap().is_clean());

    std::fs::remove_file(d.join("config.json")).unwrap(); // missing
    let shard1 = d.join("model-00001-of-00002.safetensors");
    std::fs::write(&shard1, &files["model-00001-of-00002.safetensors"][..1000]).unwrap(); // truncated
    let mut corrupt = files["model-00002-of-00002.safetensors"].clone();
    corrupt[12345] ^= 0xff;
    std::fs::write(d.join("model-00002-of-00002.safetensors"), &corrupt).unwrap(); // corrupt, same size
    std::fs::rename(
        d.join("sub/tokenizer.json"),
        d.join("tokenizer-renamed.json"),
    )
    .unwrap(); // renamed
    std::fs::write(d.join("a.bin"), vec![1; 1001]).unwrap(); // oversized
    std::fs::write(d.join("notes.txt"), b"mine").unwrap(); // extra
    std::fs::create_dir_all(d.join(".cache")).unwrap();
    std::fs::write(d.join(".cache/ignored"), b"x").unwrap(); // hidden: ignored

    let report = verify_dir(d, &m).unwrap();
    let status = |p: &str| {
        report
            .checks
            .iter()
            .find(|c| c.path == p)
            .map(|c| c.status.clone())
            .unwrap()
    };
    assert_eq!(status("config.json"), FileStatus::Missing);
    assert_eq!(
        status("model-00001-of-00002.safetensors"),
        FileStatus::Truncated {
            expected_size: 300_000,
            actual_size: 1000
        }
    );
    assert!(matches!(
        status("model-00002-of-00002.safetensors"),
        FileStatus::Corrupt { .. }
    ));
    assert_eq!(
        status("sub/tokenizer.json"),
        FileStatus::Renamed {
            found_at: "tokenizer-renamed.json".into()
        }
    );
    assert_eq!(
        status("a.bin"),
        FileStatus::Oversized {
            expected_size: 1000,
            actual_size: 1001
        }
    );
    assert_eq!(status("notes.txt"), FileStatus::Extra { size: 4 });
    assert_eq!(status("b.bin"), FileStatus::Ok);
    assert_eq!(report.checks.len(), 7, "{:?}", report.checks);
    assert!(!report.is_clean() && !report.all_present());
    let mut fetch = report.to_fetch();
    fetch.sort();
    assert_eq!(
        fetch,
        [
            "a.bin",
            "config.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "sub/tokenizer.json"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_fetches_only_what_is_wrong_and_resumes_a_cut_transfer() {
    let (hf, hub, ms) = hf_hub_with_modelscope_down(model_files()).await;
    let dest = tempfile::tempdir().unwrap();
    let files = model_files();
    // config.json present and right; shard 2 corrupt; shard 1 and tokenizer missing.
    std::fs::write(dest.path().join("config.json"), &files["config.json"]).unwrap();
    let mut bad = files["model-00002-of-00002.safetensors"].clone();
    bad[0] ^= 1;
    std::fs::write(dest.path().join("model-00002-of-00002.safetensors"), bad).unwrap();
    hub.cut_next
        .lock()
        .unwrap()
        .insert("model-00001-of-00002.safetensors".into());

    let s = download(&request(
        dest.path(),
        hf,
        ms,
        Some(reference_manifest()),
        Source::Auto,
        3,
    ))
    .await
    .unwrap();
    let mut fetched = s.fetched.clone();
    fetched.sort();
    assert_eq!(
        fetched,
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "sub/tokenizer.json"
        ]
    );
    assert_eq!(s.already_ok, 1);
    assert_eq!(s.resumed, ["model-00001-of-00002.safetensors"]);
    assert!(s.sources.iter().all(|(_, k)| *k == HubKind::Huggingface));
    // The retry asked for exactly the bytes after the half already on disk.
    let log = hub.log.lock().unwrap().clone();
    let shard1: Vec<_> = log
        .iter()
        .filter(|(p, _)| p == "model-00001-of-00002.safetensors")
        .collect();
    assert_eq!(shard1.len(), 2, "{log:?}");
    assert_eq!(shard1[0].1, None);
    assert_eq!(shard1[1].1.as_deref(), Some("bytes=150000-"));
    assert!(
        !log.iter().any(|(p, _)| p == "config.json"),
        "a good file was downloaded again"
    );
    assert!(
        verify_dir(dest.path(), &reference_manifest())
            .unwrap()
            .is_clean()
    );
    assert!(
        !dest
            .path()
            .join(PARTIAL_DIR)
            .join("model-00001-of-00002.safetensors.part")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_download_resumes_in_a_later_call() {
    let (hf, hub, ms) = hf_hub_with_modelscope_down(model_files()).await;
    let dest = tempfile::tempdir().unwrap();
    hub.cut_next
        .lock()
        .unwrap()
        .insert("model-00002-of-00002.safetensors".into());
    let err = download(&request(
        dest.path(),
        hf,
        ms,
        Some(reference_manifest()),
        Source::Huggingface,
        1,
    ))
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("model-00002-of-00002.safetensors"),
        "{err:#}"
    );
    let part = dest
        .path()
        .join(PARTIAL_DIR)
        .join("model-00002-of-00002.safetensors.part");
    assert_eq!(std::fs::metadata(&part).unwrap().len(), 100_000);
    // A partial file is not the file: verification still reports it missing.
    let report = verify_dir(dest.path(), &reference_manifest()).unwrap();
    assert!(
        report
            .to_fetch()
            .contains(&"model-00002-of-00002.safetensors".to_string())
    );

    let s = download(&request(
        dest.path(),
        hf,
        ms,
        Some(reference_manifest()),
        Source::Huggingface,
        1,
    ))
    .await
    .unwrap();
    assert_eq!(s.resumed, ["model-00002-of-00002.safetensors"]);
    let tokenizer_len = model_files()["sub/tokenizer.json"].len() as u64;
    assert_eq!(
        s.bytes_downloaded,
        100_000 + tokenizer_len,
        "only the missing half is transferred"
    );
    let log = hub.log.lock().unwrap().clone();
    let ranges: Vec<_> = log
        .iter()
        .filter(|(p, _)| p == "model-00002-of-00002.safetensors")
        .map(|(_, r)| r.clone())
        .collect();
    assert_eq!(ranges, [None, Some("bytes=100000-".to_string())]);
    assert!(
        verify_dir(dest.path(), &reference_manifest())
            .unwrap()
            .is_clean()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_source_falls_back_to_modelscope() {
    let (hf, _) = start_hub(Hub {
        down: true,
        ..Default::default()
    })
    .await;
    let (ms, ms_hub) = start_hub(Hub {
        files: model_files(),
        ..Default::default()
    })
    .await;
    let dest = tempfile::tempdir().unwrap();
    // No manifest: the file list and hashes come from ModelScope's listing.
    let s = download(&request(dest.path(), hf, ms, None, Source::Auto, 2))
        .await
        .unwrap();
    assert_eq!(s.fetched.len(), 4);
    assert!(s.sources.iter().all(|(_, k)| *k == HubKind::Modelscope));
    assert!(
        verify_dir(dest.path(), &reference_manifest())
            .unwrap()
            .is_clean()
    );
    assert_eq!(ms_hub.log.lock().unwrap().len(), 4);
    // A second run finds everything in place and downloads nothing.
    let again = download(&request(dest.path(), hf, ms, None, Source::Auto, 2))
        .await
        .unwrap();
    assert!(again.fetched.is_empty() && again.already_ok == 4);
    // Forcing the dead source fails with a clear error.
    let err = download(&request(
        tempfile::tempdir().unwrap().path(),
        hf,
        ms,
        None,
        Source::Huggingface,
        1,
    ))
    .await
    .unwrap_err();
    assert!(
        format!("{err:#}").contains("no source could list"),
        "{err:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_transfer_is_rejected_and_renamed_file_is_moved_back() {
    // The hub serves bytes that do not match the manifest.
    let mut wrong = model_files();
    wrong.get_mut("config.json").unwrap()[0] = b'[';
    let (hf, _, ms) = hf_hub_with_modelscope_down(wrong).await;
    let dest = tempfile::tempdir().unwrap();
    let mut files = model_files();
    files.remove("config.json");
    let tok = files.remove("sub/tokenizer.json").unwrap();
    write_all(dest.path(), &files);
    std::fs::write(dest.path().join("tok.json"), tok).unwrap();
    let err = download(&request(
        dest.path(),
        hf,
        ms,
        Some(reference_manifest()),
        Source::Auto,
        1,
    ))
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("config.json"), "{err:#}");
    assert!(
        !dest.path().join("config.json").exists(),
        "a file with the wrong hash was put in place"
    );
    assert!(
        dest.path().join("sub/tokenizer.json").exists(),
        "renamed file was not moved back"
    );
}

/// A DFlash drafter is pulled as any repository is (`kestrel pull
/// z-lab/Qwen3.6-35B-A3B-DFlash`): the z-lab layout (a `config.json` with
/// `dflash_config` and the drafter's safetensors, no tokenizer) arrives
/// byte for byte, each file checked against the listing's SHA-256, and a
/// second pull fetches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dflash_drafter_repository_is_pulled_and_verified() {
    let drafter = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dflash/drafter");
    let files: BTreeMap<String, Vec<u8>> = ["config.json", "model.safetensors"]
        .iter()
        .map(|n| (n.to_string(), std::fs::read(drafter.join(n)).unwrap()))
        .collect();
    let config: serde_json::Value = serde_json::from_slice(&files["config.json"]).unwrap();
    assert!(
        config["dflash_config"]["mask_token_id"].is_u64(),
        "a z-lab drafter config"
    );
    let (hf, _, ms) = hf_hub_with_modelscope_down(files.clone()).await;
    let dest = tempfile::tempdir().unwrap();
    let s = download(&request(dest.path(), hf, ms, None, Source::Auto, 2))
        .await
        .unwrap();
    assert_eq!(s.fetched.len(), 2);
    for (name, bytes) in &files {
        assert_eq!(
            &std::fs::read(dest.path().join(name)).unwrap(),
            bytes,
            "{name}"
        );
    }
    let manifest = Manifest::from_dir(&drafter, None, None).unwrap();
    assert!(verify_dir(dest.path(), &manifest).unwrap().is_clean());
    let again = download(&request(dest.path(), hf, ms, None, Source::Auto, 2))
        .await
        .unwrap();
    assert!(again.fetched.is_empty() && again.already_ok == 2);
}
