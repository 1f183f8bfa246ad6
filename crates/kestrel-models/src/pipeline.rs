//! Loading checkpoint files as a pipeline: blocks read and pack their
//! parameters on worker threads while the calling thread uploads the ones
//! already packed.
//!
//! Every byte of a checkpoint passes through the host twice: read from the
//! page cache (and, for experts stored one by one, stacked into the
//! `[E, 2I, H]` layout) and then copied to the device. Done one after the
//! other on one thread, a load runs at one core's copy speed. Here the
//! layers are built by a few workers, each reading with all cores, and every
//! packed tensor goes through a queue to the thread that called the load
//! (the one that opened the backend), which does nothing but upload: the
//! device copy of one tensor overlaps the reading of the next ones. A worker
//! waits for its tensor's upload before packing another, so the host holds
//! at most one packed tensor per packing thread, plus the few idle buffers
//! kept for reuse (`buffers.rs`): memory is bounded by the number of
//! workers, not by the size of the checkpoint.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Result;
use kestrel_core::{Backend, DType, HostTensor, HostWeight};
use serde_json::{Value, json};

use crate::buffers::BufferPool;
use crate::fp8::WeightForm;
use crate::loader::Loader;
use crate::upload_queue::UploadRequest;
use crate::weights::WeightFiles;

/// What the calling thread does with packed tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// Upload them: a usable model.
    Upload,
    /// Drop them and hand back one-element placeholders: measures reading
    /// and packing alone. The model it builds must not be run.
    PackOnly,
}

/// How a load went: what `kestrel bench-load` and `bench-model` report.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadStats {
    pub mode: LoadMode,
    /// From opening the files to the last weight uploaded.
    pub wall_seconds: f64,
    /// Checkpoint tensor bytes read.
    pub checkpoint_bytes: u64,
    /// Bytes of the packed tensors handed to the backend.
    pub packed_bytes: u64,
    /// Time the workers spent reading and packing, summed over workers.
    pub pack_seconds: f64,
    /// Time the uploading thread spent in `Backend::upload`.
    pub upload_seconds: f64,
    /// Threads packing layers concurrently.
    pub workers: usize,
    /// The process's peak resident memory (`VmHWM`) when the load ended.
    pub peak_rss_bytes: Option<u64>,
    /// Its resident memory (`VmRSS`) when the load ended.
    pub rss_bytes: Option<u64>,
}

impl LoadStats {
    pub fn gb_per_second(&self) -> f64 {
        self.checkpoint_bytes as f64 / 1e9 / self.wall_seconds.max(1e-9)
    }

    pub fn to_json(&self) -> Value {
        let gb = |b: u64| b as f64 / 1e9;
        json!({
            "mode": match self.mode { LoadMode::Upload => "upload", LoadMode::PackOnly => "pack-only" },
            "wall_seconds": self.wall_seconds,
            "checkpoint_gb": gb(self.checkpoint_bytes),
            "packed_gb": gb(self.packed_bytes),
            "gb_per_second": self.gb_per_second(),
            "pack_seconds_all_workers": self.pack_seconds,
            "upload_seconds": self.upload_seconds,
            "workers": self.workers,
            "peak_rss_gb": self.peak_rss_bytes.map(gb),
            "rss_gb": self.rss_bytes.map(gb),
        })
    }

    /// One line for the terminal.
    pub fn summary(&self) -> String {
        let gb = |b: Option<u64>| b.map_or("?".into(), |b| format!("{:.2}", b as f64 / 1e9));
        format!(
            "{:.2} GB in {:.2} s = {:.2} GB/s ({} workers; packing {:.2} s over all workers, \
             uploads {:.2} s); peak RSS {} GB, RSS {} GB",
            self.checkpoint_bytes as f64 / 1e9,
            self.wall_seconds,
            self.gb_per_second(),
            self.workers,
            self.pack_seconds,
            self.upload_seconds,
            gb(self.peak_rss_bytes),
            gb(self.rss_bytes),
        )
    }
}

/// Workers packing layers at once: enough to keep the uploading thread
/// busy; each one holds at most one packed tensor (up to about a gigabyte for
/// a stack of experts or an embedding).
pub fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 4)
}

/// How [`load`] loads.
#[derive(Clone, Copy, Debug)]
pub struct LoadPlan {
    /// Zero-centred decoder norms (hybrid models).
    pub zero_centred_norms: bool,
    pub mode: LoadMode,
    pub form: WeightForm,
}

/// Builds `T` from `files` with `build` run on a worker thread, serving its
/// uploads (or, in [`LoadMode::PackOnly`], dropping them) on this thread.
pub fn load<'a, B: Backend, T: Send>(
    files: &'a WeightFiles,
    backend: &'a B,
    plan: LoadPlan,
    build: impl FnOnce(&Loader<'a, B>) -> Result<T> + Send,
) -> Result<(T, LoadStats)> {
    let start = Instant::now();
    let workers = default_workers();
    let (tx, rx) = mpsc::sync_channel::<UploadRequest<B>>(0);
    let buffers = Arc::new(BufferPool::new(workers + 2));
    let placeholder = HostTensor {
        dtype: DType::F32,
        shape: vec![1],
        data: vec![0u8; 4].into(),
    };
    let (built, upload_seconds) = std::thread::scope(|s| {
        let given_back = Arc::clone(&buffers);
        let walker = s.spawn(move || {
            let loader = Loader::queued(
                files,
                backend,
                plan.zero_centred_norms,
                tx,
                workers,
                buffers,
            )
            .with_quantization(plan.form);
            let built = build(&loader);
            (built, loader.counters)
        });
        let mut upload_seconds = 0.0;
        for request in rx {
            let t = Instant::now();
            let weight = match plan.mode {
                LoadMode::Upload => backend.upload_weight(&request.tensor),
                LoadMode::PackOnly => backend.upload(&placeholder),
            };
            upload_seconds += t.elapsed().as_secs_f64();
            match request.tensor {
                HostWeight::Dense(HostTensor {
                    data: Cow::Owned(buffer),
                    ..
                })
                | HostWeight::BlockFp8(kestrel_core::BlockFp8 {
                    codes: Cow::Owned(buffer),
                    ..
                }) => given_back.give(buffer),
                _ => {}
            }
            // A worker that gave up no longer listens; nothing to do then.
            let _ = request.reply.send(weight);
        }
        let built = walker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (built, upload_seconds)
    });
    let (value, counters) = built;
    let value = value?;
    let stats = LoadStats {
        mode: plan.mode,
        wall_seconds: start.elapsed().as_secs_f64(),
        checkpoint_bytes: counters.checkpoint_bytes(),
        packed_bytes: counters.packed_bytes(),
        pack_seconds: counters.pack_seconds(),
        upload_seconds,
        workers,
        peak_rss_bytes: status_bytes("VmHWM"),
        rss_bytes: status_bytes("VmRSS"),
    };
    Ok((value, stats))
}

/// A `kB` field of `/proc/self/status` in bytes (`None` off Linux).
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use kestrel_cpu::CpuBackend;

    use super::*;
    use crate::runner::SequenceRunner;
    use crate::{Model, ModelConfig};

    fn golden(arch: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/golden")
            .join(arch)
            .join("model")
    }

    /// The model built in order on one thread, uploads and all.
    fn load_in_order(dir: &std::path::Path, b: &CpuBackend) -> Model<CpuBackend> {
        let config = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let files = WeightFiles::open(dir).unwrap();
        let hybrid = config.arch.is_hybrid();
        Model::build(&Loader::from_files(&files, b, hybrid), config).unwrap()
    }

    fn logits(b: &CpuBackend, model: &Model<CpuBackend>) -> (Vec<f32>, Option<Vec<f32>>) {
        let tokens: Vec<u32> = (0..12).map(|i| (i * 37 % 500) as u32).collect();
        let mut runner = SequenceRunner::new(b, model, tokens.len()).unwrap();
        runner.teacher_forced(&tokens).unwrap()
    }

    #[test]
    fn pipelined_load_gives_the_weights_of_an_ordered_load() {
        let b = CpuBackend::new();
        for arch in ["qwen3", "qwen3_moe", "qwen3_5_moe", "qwen3_next"] {
            let dir = golden(arch);
            let (pipelined, stats) = Model::load_timed(&dir, &b).unwrap();
            let ordered = load_in_order(&dir, &b);
            assert_eq!(logits(&b, &pipelined), logits(&b, &ordered), "{arch}");
            assert_eq!(pipelined.decoder.layers.len(), ordered.decoder.layers.len());
            assert!(
                stats.workers >= 2 && stats.checkpoint_bytes > 0,
                "{stats:?}"
            );
        }
    }

    #[test]
    fn experts_stored_one_by_one_are_stacked_gate_rows_first() {
        let b = CpuBackend::new();
        let dir = golden("qwen3_moe");
        let model = Model::load(&dir, &b).unwrap();
        let files = WeightFiles::open(&dir).unwrap();
        let crate::blocks::FeedForward::Moe { weights, spec } = &model.decoder.layers[0].ffn else {
            panic!("qwen3_moe layer 0 is sparse")
        };
        let (i, h) = (spec.intermediate, model.config().hidden_size);
        let expert = spec.num_experts - 1;
        let p = "model.layers.0.mlp.experts.";
        let gate = files
            .get(&format!("{p}{expert}.gate_proj.weight"), &[i, h])
            .unwrap();
        let up = files
            .get(&format!("{p}{expert}.up_proj.weight"), &[i, h])
            .unwrap();
        let want: Vec<f32> = gate.to_f32().into_iter().chain(up.to_f32()).collect();
        let got = &weights.gate_up.data[expert * 2 * i * h..(expert + 1) * 2 * i * h];
        assert_eq!(got, &want[..]);
    }

    #[test]
    fn pack_only_reads_every_tensor_the_model_uses_once() {
        let b = CpuBackend::new();
        // qwen3_moe: every stored tensor is a parameter (no vision tower, no tied head).
        let dir = golden("qwen3_moe");
        let files = WeightFiles::open(&dir).unwrap();
        let stored: u64 = files
            .names()
            .map(|n| files.get_any(n).unwrap().data.len() as u64)
            .sum();
        let packed = Model::pack_only(&dir, &b).unwrap();
        let (_, loaded) = Model::load_timed(&dir, &b).unwrap();
        assert_eq!(packed.checkpoint_bytes, stored);
        assert_eq!(loaded.checkpoint_bytes, stored);
        assert_eq!(packed.packed_bytes, loaded.packed_bytes);
        assert_eq!(packed.mode, LoadMode::PackOnly);
        assert!(packed.peak_rss_bytes.is_some_and(|p| p > 0));
    }

    #[test]
    fn a_broken_tensor_fails_the_pipelined_load_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(golden("qwen3_moe")).unwrap() {
            let path = entry.unwrap().path();
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
        // Point one expert of the last layer at a name the files lack.
        let index = dir.path().join("model.safetensors.index.json");
        let text = std::fs::read_to_string(&index).unwrap();
        let config = ModelConfig::from_file(&dir.path().join("config.json")).unwrap();
        let last = config.num_layers - 1;
        let name = format!("model.layers.{last}.mlp.experts.1.up_proj.weight");
        assert!(text.contains(&name));
        let files = WeightFiles::open(dir.path()).unwrap();
        let file = files.file_of(&name).to_path_buf();
        drop(files);
        let bytes = std::fs::read(&file).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
        // Same length: the header keeps its size and every offset.
        let renamed = header.replace(&name, &name.replace("up_proj", "UP_proj"));
        let mut out = bytes[..8].to_vec();
        out.extend(renamed.as_bytes());
        out.extend(&bytes[8 + n..]);
        std::fs::write(&file, out).unwrap();
        let err = match Model::load(dir.path(), &CpuBackend::new()) {
            Ok(_) => panic!("a model with a missing tensor loaded"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(&name), "{err}");
    }
}
