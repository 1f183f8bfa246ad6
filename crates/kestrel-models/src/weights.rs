//! Safetensors model files: one file or shards listed in
//! `model.safetensors.index.json`. Model files are untrusted input, so every
//! header is bounds-checked and every problem names the file and the tensor.
//!
//! Files are memory-mapped. The loader copies tensors out of the map into
//! its own buffers, in parallel chunks, and then drops the pages it read
//! from the process (`MADV_DONTNEED`; they stay in the page cache): resident
//! memory stays at the buffers in flight instead of growing to the whole
//! checkpoint, which matters where the host and the GPU share one memory.
//! Copying from the map measured faster than positioned reads (`pread`)
//! into the same buffers (`docs/benchmarks/2026-12-01-cpu-cold-load/`).

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kestrel_core::{DType, HostTensor};
use memmap2::{Mmap, UncheckedAdvice};
use rayon::prelude::*;
use safetensors::{Dtype, SafeTensors};

/// Copies of large tensors are split into chunks of this size, copied in parallel.
const READ_CHUNK: usize = 4 << 20;

/// How a tensor is stored: a dense dtype, or e4m3 codes of a block-FP8
/// weight (whose scales are another tensor, see [`crate::fp8`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Dense(DType),
    F8E4M3,
}

impl std::fmt::Display for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stored::Dense(d) => write!(f, "{d:?}"),
            Stored::F8E4M3 => f.write_str("F8_E4M3"),
        }
    }
}

impl Stored {
    fn size(self) -> usize {
        match self {
            Stored::Dense(d) => d.size(),
            Stored::F8E4M3 => 1,
        }
    }
}

struct Entry {
    file: usize,
    dtype: Stored,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

struct Shard {
    path: PathBuf,
    map: Mmap,
}

pub struct WeightFiles {
    files: Vec<Shard>,
    tensors: HashMap<String, Entry>,
}

impl WeightFiles {
    /// Open every safetensors file of a model folder.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let paths: Vec<PathBuf> = if index.exists() {
            shard_paths(&index)?
                .into_iter()
                .map(|f| dir.join(f))
                .collect()
        } else {
            let single = dir.join("model.safetensors");
            if single.exists() {
                vec![single]
            } else {
                let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                    .with_context(|| format!("cannot read model folder {}", dir.display()))?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                    .collect();
                found.sort();
                if found.is_empty() {
                    bail!("no .safetensors files in {}", dir.display());
                }
                found
            }
        };
        let mut files = Vec::new();
        let mut tensors = HashMap::new();
        for path in paths {
            let file =
                File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
            // SAFETY: the map is read-only; a file changed under us is the user's
            // problem, as with every mmap-based loader.
            let map = unsafe { Mmap::map(&file) }
                .with_context(|| format!("cannot map {}", path.display()))?;
            let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
                anyhow::anyhow!(
                    "{}: not a valid safetensors file, truncated or corrupt ({e})",
                    path.display()
                )
            })?;
            let data_start = 8 + header_len;
            let data_len = map.len().saturating_sub(data_start);
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    Dtype::F32 => Stored::Dense(DType::F32),
                    Dtype::F16 => Stored::Dense(DType::F16),
                    Dtype::BF16 => Stored::Dense(DType::BF16),
                    Dtype::F8_E4M3 => Stored::F8E4M3,
                    other => bail!(
                        "{}: tensor {name} has unsupported dtype {other:?} (expected BF16, F16, F32 or F8_E4M3)",
                        path.display()
                    ),
                };
                let (start, end) = info.data_offsets;
                let numel: usize = info.shape.iter().product();
                if end < start || end > data_len || end - start != numel * dtype.size() {
                    bail!(
                        "{}: tensor {name} data range {start}..{end} does not fit the file (truncated or corrupt)",
                        path.display()
                    );
                }
                let entry = Entry {
                    file: files.len(),
                    dtype,
                    shape: info.shape.clone(),
                    start: data_start + start,
                    end: data_start + end,
                };
                if tensors.insert(name.clone(), entry).is_some() {
                    bail!(
                        "{}: tensor {name} appears in more than one file",
                        path.display()
                    );
                }
            }
            files.push(Shard { path, map });
        }
        Ok(WeightFiles { files, tensors })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// How a tensor is stored and its shape, if the files have it.
    pub fn stored(&self, name: &str) -> Option<(Stored, &[usize])> {
        self.tensors.get(name).map(|e| (e.dtype, &e.shape[..]))
    }

    /// The tensor, with its shape checked against what the model expects.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor<'_>> {
        let t = self.get_any(name)?;
        if t.shape != shape {
            bail!(
                "{}: tensor {name} has shape {:?}, expected {shape:?}",
                self.file_of(name).display(),
                t.shape
            );
        }
        Ok(t)
    }

    /// The tensor with whatever shape it has.
    /// Tells the kernel that `name`'s pages are read at random (a table read
    /// by rows): no read-ahead around a fault and no mapping of the pages
    /// around it, so a row makes one or two pages resident instead of the
    /// window around it. Best effort: a kernel that refuses the advice only
    /// costs memory.
    pub fn advise_random(&self, name: &str) -> Result<()> {
        let e = self.entry(name)?;
        // memmap2 widens the range to whole pages of the system's size.
        let _ =
            self.files[e.file]
                .map
                .advise_range(memmap2::Advice::Random, e.start, e.end - e.start);
        Ok(())
    }

    pub fn get_any(&self, name: &str) -> Result<HostTensor<'_>> {
        let e = self.entry(name)?;
        Ok(HostTensor {
            dtype: self.dense(name, e)?,
            shape: e.shape.clone(),
            data: Cow::Borrowed(&self.files[e.file].map[e.start..e.end]),
        })
    }

    /// The dtype and byte length of a tensor, its shape checked.
    pub fn describe(&self, name: &str, shape: &[usize]) -> Result<(DType, usize)> {
        let e = self.entry(name)?;
        if e.shape != shape {
            bail!(
                "{}: tensor {name} has shape {:?}, expected {shape:?}",
                self.file_of(name).display(),
                e.shape
            );
        }
        Ok((self.dense(name, e)?, e.end - e.start))
    }

    /// The byte length of a tensor stored in any form, its shape checked.
    pub fn byte_len(&self, name: &str, shape: &[usize]) -> Result<usize> {
        let e = self.entry(name)?;
        if e.shape != shape {
            bail!(
                "{}: tensor {name} has shape {:?}, expected {shape:?}",
                self.file_of(name).display(),
                e.shape
            );
        }
        Ok(e.end - e.start)
    }

    fn dense(&self, name: &str, e: &Entry) -> Result<DType> {
        match e.dtype {
            Stored::Dense(d) => Ok(d),
            Stored::F8E4M3 => bail!(
                "{}: tensor {name} is F8_E4M3, read where a dense tensor is expected",
                self.file_of(name).display()
            ),
        }
    }

    /// Copies the tensor's bytes into `dst`, which must be exactly as long,
    /// in parallel chunks, then drops the pages read from this process.
    pub fn read_into(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        let e = self.entry(name)?;
        let shard = &self.files[e.file];
        if dst.len() != e.end - e.start {
            bail!(
                "{}: tensor {name} has {} bytes, read into {}",
                shard.path.display(),
                e.end - e.start,
                dst.len()
            );
        }
        dst.par_chunks_mut(READ_CHUNK)
            .zip(shard.map[e.start..e.end].par_chunks(READ_CHUNK))
            .for_each(|(d, s)| d.copy_from_slice(s));
        // SAFETY: the map is a shared, read-only file mapping: dropped pages
        // are read again from the file on the next access (by a neighbouring
        // tensor on the same page, or a view from `get`), so no data is lost.
        // Dropping them is only a saving; a failure changes nothing.
        let _ = unsafe {
            shard
                .map
                .unchecked_advise_range(UncheckedAdvice::DontNeed, e.start, e.end - e.start)
        };
        Ok(())
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.tensors.get(name).with_context(|| {
            let files: Vec<String> = self
                .files
                .iter()
                .map(|f| f.path.display().to_string())
                .collect();
            format!("missing tensor {name} in {}", files.join(", "))
        })
    }

    pub fn file_of(&self, name: &str) -> &Path {
        self.tensors
            .get(name)
            .map(|e| self.files[e.file].path.as_path())
            .unwrap_or(Path::new("?"))
    }
}

fn shard_paths(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index)
        .with_context(|| format!("cannot read {}", index.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: invalid JSON", index.display()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .with_context(|| format!("{}: no \"weight_map\" object", index.display()))?;
    let mut files: Vec<String> = Vec::new();
    for f in map.values() {
        let f = f.as_str().with_context(|| {
            format!("{}: weight_map values must be file names", index.display())
        })?;
        if f.contains('/') || f.contains('\\') || f.starts_with('.') {
            bail!(
                "{}: shard name {f:?} must be a plain file name",
                index.display()
            );
        }
        if !files.iter().any(|x| x == f) {
            files.push(f.to_string());
        }
    }
    files.sort();
    Ok(files)
}
