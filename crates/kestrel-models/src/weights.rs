//! Safetensors model files, memory-mapped: one file or shards listed in
//! `model.safetensors.index.json`. Model files are untrusted input, so every
//! header is bounds-checked and every problem names the file and the tensor.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kestrel_core::{DType, HostTensor};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub struct WeightFiles {
    files: Vec<(PathBuf, Mmap)>,
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
                    Dtype::F32 => DType::F32,
                    Dtype::F16 => DType::F16,
                    Dtype::BF16 => DType::BF16,
                    other => bail!(
                        "{}: tensor {name} has unsupported dtype {other:?} (expected BF16, F16 or F32)",
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
            files.push((path, map));
        }
        Ok(WeightFiles { files, tensors })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
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
    pub fn get_any(&self, name: &str) -> Result<HostTensor<'_>> {
        let Some(e) = self.tensors.get(name) else {
            let files: Vec<String> = self
                .files
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect();
            bail!("missing tensor {name} in {}", files.join(", "));
        };
        Ok(HostTensor {
            dtype: e.dtype,
            shape: e.shape.clone(),
            data: Cow::Borrowed(&self.files[e.file].1[e.start..e.end]),
        })
    }

    pub fn file_of(&self, name: &str) -> &Path {
        self.tensors
            .get(name)
            .map(|e| self.files[e.file].0.as_path())
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
