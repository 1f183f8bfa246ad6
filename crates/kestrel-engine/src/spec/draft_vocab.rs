//! A reduced draft vocabulary: the token ids the MTP head may draft, read
//! from a file (one id per line, or a JSON array). Drafting then scores
//! only those rows of the lm_head (`kestrel_models::DraftHead`); the target
//! verifies over the whole vocabulary, so output never depends on it.
//!
//! The ids are kept ascending whatever order the file lists them in
//! (files made from token counts list the most frequent first), so ties
//! between scores go to the lower id, as over the whole head.

use std::path::Path;

use anyhow::{Context, Result, bail};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftVocab {
    ids: Vec<u32>,
}

impl DraftVocab {
    /// Ids from text: a JSON array of integers, or one integer per line
    /// (blank lines and lines starting with `#` are skipped). Duplicates
    /// are refused: a file that lists an id twice was not made as meant.
    pub fn parse(text: &str) -> Result<Self> {
        let ids: Vec<u32> = if text.trim_start().starts_with('[') {
            serde_json::from_str(text).context(
                "a draft vocabulary in JSON must be an array of non-negative integer token ids",
            )?
        } else {
            text.lines()
                .enumerate()
                .map(|(i, line)| (i + 1, line.trim()))
                .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
                .map(|(n, line)| {
                    line.parse::<u32>().with_context(|| {
                        format!("line {n}: `{line}` is not a non-negative integer token id")
                    })
                })
                .collect::<Result<_>>()?
        };
        Self::new(ids)
    }

    /// [`DraftVocab::parse`] of a file's contents.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the draft vocabulary {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("bad draft vocabulary {}", path.display()))
    }

    /// The ids `0..n` (for random-weight benchmarks, where no id is more
    /// frequent than another).
    pub fn first(n: usize) -> Result<Self> {
        Self::new((0..n as u32).collect())
    }

    /// `ids` in any order; refused when empty or with a duplicate.
    pub fn new(mut ids: Vec<u32>) -> Result<Self> {
        if ids.is_empty() {
            bail!("a draft vocabulary needs at least one token id");
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            bail!("token id {} is listed twice in the draft vocabulary", w[0]);
        }
        Ok(Self { ids })
    }

    /// The ids, ascending.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Refuses ids the model cannot draft: `vocab` is the ids sampling may
    /// choose (the tokenizer's, when the embedding is padded beyond it).
    pub fn check(&self, vocab: usize) -> Result<(), String> {
        match self.ids.last() {
            Some(&top) if top as usize >= vocab => Err(format!(
                "draft vocabulary id {top} is out of range: the model drafts ids below {vocab}"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_json_arrays_give_the_same_ascending_ids() {
        let lines = DraftVocab::parse("# most frequent first\n17\n3\n\n  250\n").unwrap();
        let json = DraftVocab::parse(" [17, 3, 250]\n").unwrap();
        assert_eq!(lines.ids(), &[3, 17, 250]);
        assert_eq!(lines, json);
        assert_eq!(DraftVocab::first(3).unwrap().ids(), &[0, 1, 2]);
    }

    #[test]
    fn bad_files_are_clear_errors() {
        for (text, needle) in [
            ("", "at least one"),
            ("[]", "at least one"),
            ("1\n2\n1\n", "listed twice"),
            ("[4, 4]", "listed twice"),
            ("1\n-2\n", "line 2"),
            ("1\nfoo\n", "line 2"),
            ("[1, 2.5]", "JSON"),
            ("[1, -1]", "JSON"),
            ("[1, 2", "JSON"),
        ] {
            let err = DraftVocab::parse(text).unwrap_err();
            assert!(format!("{err:#}").contains(needle), "{text:?}: {err:#}");
        }
    }

    #[test]
    fn ids_outside_the_vocabulary_are_refused() {
        let v = DraftVocab::parse("[0, 511]").unwrap();
        assert!(v.check(512).is_ok());
        let err = v.check(511).unwrap_err();
        assert!(err.contains("511") && err.contains("out of range"), "{err}");
    }
}
