//! Flash-Next with dummy (file-less) weights: the loader draws every
//! parameter at its real shape, and each PLE module's n-gram table, 51.2 B
//! parameters in the real model, is a sparse file of its full size that is
//! memory-mapped like a checkpoint's. A row read costs the page fault it costs
//! with real files, while the file takes no disk blocks: its rows read as
//! zeros, which leaves the PLE gate and conv to run on real activations.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::config::FlashNextConfig;
use super::ngram::NgramHasher;
use crate::weights::WeightFiles;

/// The table shards of every PLE module: checkpoint name, rows, row width.
pub fn table_shards(config: &FlashNextConfig) -> Vec<(String, usize, usize)> {
    let Some(pc) = &config.ple else {
        return Vec::new();
    };
    let p = &config.base.weight_prefix;
    let mut shards = Vec::new();
    for (index, &layer) in pc.layers.iter().enumerate() {
        let rows = NgramHasher::new(pc, config.base.vocab_size, index).rows as usize;
        let prefix = format!("{p}layers.{layer}.ple.ple_embedding.ngram_embedding.");
        let parts = pc.split_parts.max(1);
        for i in 0..parts {
            let name = if parts == 1 {
                format!("{prefix}weight")
            } else {
                format!("{prefix}shard_{i}.weight")
            };
            shards.push((name, rows / parts, pc.head_dim()));
        }
    }
    shards
}

/// The safetensors header (length prefix included, padded to 8 bytes) of
/// bf16 `shards`, and the size of their data.
fn header(shards: &[(String, usize, usize)]) -> (Vec<u8>, u64) {
    let mut meta = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, rows, dim) in shards {
        let bytes = (*rows * *dim * 2) as u64;
        meta.insert(
            name.clone(),
            serde_json::json!({
                "dtype": "BF16",
                "shape": [rows, dim],
                "data_offsets": [offset, offset + bytes],
            }),
        );
        offset += bytes;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(meta)).expect("a JSON map");
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend(json);
    (out, offset)
}

/// A folder holding `model.safetensors` with the config's n-gram tables as
/// one sparse file (made in `dir` unless an identical one is there), opened.
pub fn sparse_tables(config: &FlashNextConfig, dir: &Path) -> Result<WeightFiles> {
    let shards = table_shards(config);
    let (head, data) = header(&shards);
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join("model.safetensors");
    let size = head.len() as u64 + data;
    // Only the length and the header are compared: the data is never read.
    let reusable =
        fs::metadata(&path).is_ok_and(|m| m.len() == size) && header_matches(&path, &head)?;
    if !reusable {
        let mut f =
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        f.write_all(&head)?;
        // Extending the length writes no blocks: the data is a hole.
        f.set_len(size)
            .with_context(|| format!("cannot size {} to {size} bytes", path.display()))?;
    }
    WeightFiles::open(dir)
}

fn header_matches(path: &Path, head: &[u8]) -> Result<bool> {
    use std::io::Read;
    let mut f = File::open(path)?;
    let mut got = vec![0u8; head.len()];
    Ok(f.read_exact(&mut got).is_ok() && got == head)
}

/// Where dummy tables go unless a folder is given: one folder per shape
/// under the system's temporary folder.
pub fn default_dir(config: &FlashNextConfig) -> PathBuf {
    let shards = table_shards(config);
    let rows: usize = shards.iter().map(|s| s.1 * s.2).sum();
    std::env::temp_dir().join(format!("kestrel-dummy-ngram-{}x{rows}", shards.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(rel: &str) -> FlashNextConfig {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        FlashNextConfig::from_file(&root.join(rel)).expect("config parses")
    }

    #[test]
    fn the_published_config_gives_the_published_table() {
        let shards = table_shards(&config("configs/qwen3.8-flash-next/config.json"));
        assert_eq!(shards.len(), 128);
        assert!(shards.iter().all(|s| (s.1, s.2) == (2_500_012, 160)));
        let params: usize = shards.iter().map(|s| s.1 * s.2).sum();
        assert_eq!(params, 51_200_245_760);
    }

    #[test]
    fn a_sparse_table_file_opens_and_reads_zeros_and_is_reused() {
        let cfg = config("testdata/golden/qwen4_exp/model/config.json");
        let dir = std::env::temp_dir().join(format!("kestrel-test-ngram-{}", std::process::id()));
        let files = sparse_tables(&cfg, &dir).unwrap();
        for (name, rows, dim) in table_shards(&cfg) {
            let t = files.get_any(&name).unwrap();
            assert_eq!(t.shape, vec![rows, dim]);
            assert!(t.data.iter().all(|&b| b == 0));
        }
        let path = dir.join("model.safetensors");
        let before = fs::metadata(&path).unwrap().modified().unwrap();
        sparse_tables(&cfg, &dir).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), before);
        fs::remove_dir_all(&dir).unwrap();
    }
}
