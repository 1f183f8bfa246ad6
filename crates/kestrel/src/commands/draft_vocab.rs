//! `kestrel draft-vocab`: a draft-vocabulary file for MTP speculation
//! (`--draft-vocab`), made of the `--size` ids that occur most often when a
//! text corpus is tokenized with the model's tokenizer.
//!
//! Why frequency: a draft is only worth scoring if the target is likely to
//! emit it, and a model's output on a workload uses the same ids as text of
//! that workload. Ids are written most frequent first, one per line, under a
//! comment saying how the file was made; the engine reads them in any order.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kestrel_text::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hugging Face model folder whose tokenizer.json is used; the bundled
    /// model when not given.
    #[arg(long)]
    model: Option<PathBuf>,
    /// How many ids to keep (fewer if the corpus uses fewer).
    #[arg(long)]
    size: usize,
    /// Write the file here instead of to standard output.
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// Text files of the corpus.
    #[arg(required = true)]
    corpus: Vec<PathBuf>,
}

/// Text tokenized per call: whole lines up to about this many bytes, so a
/// large corpus file is not one huge encode.
const CHUNK_BYTES: usize = 1 << 20;

pub fn run(args: Args) -> Result<()> {
    if args.size == 0 {
        bail!("--size must be at least 1");
    }
    let dir = crate::model_dir::resolve(args.model.clone())?;
    let tokenizer = Tokenizer::from_model_dir(&dir)?;
    let mut counts: HashMap<u32, u64> = HashMap::new();
    let mut tokens = 0u64;
    for path in &args.corpus {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        for chunk in chunks(&text, CHUNK_BYTES) {
            for id in tokenizer.encode(chunk, false)? {
                *counts.entry(id).or_default() += 1;
                tokens += 1;
            }
        }
    }
    let ids = most_frequent(&counts, args.size);
    let mut file = format!(
        "# kestrel draft vocabulary: the {} most frequent of {} distinct ids in {tokens} tokens \
         of {} corpus file(s), tokenizer of {}\n",
        ids.len(),
        counts.len(),
        args.corpus.len(),
        dir.file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned()),
    );
    for id in &ids {
        writeln!(file, "{id}")?;
    }
    match &args.out {
        Some(path) => {
            std::fs::write(path, file)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "wrote {} ids ({} distinct in {tokens} corpus tokens) to {}",
                ids.len(),
                counts.len(),
                path.display()
            );
        }
        None => print!("{file}"),
    }
    Ok(())
}

/// The `n` ids with the highest counts, most frequent first (ties: lower id first).
fn most_frequent(counts: &HashMap<u32, u64>, n: usize) -> Vec<u32> {
    let mut ranked: Vec<(u32, u64)> = counts.iter().map(|(&id, &c)| (id, c)).collect();
    ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(n).map(|(id, _)| id).collect()
}

/// `text` cut after newlines into pieces of about `max` bytes (a line
/// longer than `max` stays whole).
fn chunks(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = if rest.len() <= max {
            rest.len()
        } else {
            let cut = rest.floor_char_boundary(max);
            rest[..cut]
                .rfind('\n')
                .or_else(|| rest[cut..].find('\n').map(|i| cut + i))
                .map_or(rest.len(), |i| i + 1)
        };
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_frequent_ids_come_first_ties_to_the_lower_id() {
        let counts = HashMap::from([(7, 3), (2, 5), (9, 3), (4, 1)]);
        assert_eq!(most_frequent(&counts, 3), vec![2, 7, 9]);
        assert_eq!(most_frequent(&counts, 10), vec![2, 7, 9, 4]);
    }

    #[test]
    fn chunks_cut_after_newlines_and_lose_nothing() {
        let text = "ab\ncd\nefgh\n\nijklmnop\nq";
        let pieces: Vec<&str> = chunks(text, 4).collect();
        assert_eq!(pieces.concat(), text);
        assert!(
            pieces[..pieces.len() - 1].iter().all(|p| p.ends_with('\n')),
            "{pieces:?}"
        );
        assert_eq!(pieces[0], "ab\n");
        assert_eq!(chunks("", 4).count(), 0);
    }
}
