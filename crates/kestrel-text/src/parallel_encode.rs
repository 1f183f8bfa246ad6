//! Encoding a long text on several cores with exactly the ids of one pass.
//!
//! A cold long prompt is tokenised before its first forward pass, so the
//! tokeniser's time adds to the time to first token one for one (a prompt of
//! ~7,000 tokens is tens of milliseconds on one core). The text is cut into
//! pieces that are encoded in parallel and their ids concatenated. That is
//! exact only where a cut falls on a boundary the tokenizer itself would
//! never cross, so cuts are made only at a *safe point* and only for a
//! tokenizer whose pipeline is known to respect it.
//!
//! A safe point is the position after a `'\n'` that follows a printable
//! ASCII character other than space, where what follows is a run of spaces
//! and tabs (possibly empty) ending in such a character (`x\ny` or
//! `x\n    y`, cut right after the `\n`): every line of indented source
//! code starts at one. For a tokenizer of the form accepted by
//! [`is_split_safe`]:
//!
//! - added tokens are matched first, on the raw text. None of them contains
//!   `'\n'`, and none strips or requires neighbouring whitespace (`lstrip`,
//!   `rstrip`, `single_word`), so a match never spans the cut and never
//!   depends on what lies across it;
//! - NFC (or no normalizer) cannot compose `'\n'` with what follows, and
//!   the character after the cut is an ASCII starter;
//! - the pre-tokenizer is one regex split (the GPT-2 style patterns listed
//!   in [`SPLIT_SAFE_PATTERNS`]) and a byte-level mapping without a prefix
//!   space. In those patterns a newline is matched by `\s*[\r\n]+`, by
//!   the `[\r\n]*` tail of a punctuation run, or by `\s+`. With no other
//!   newline in the whitespace after it (the run of spaces and tabs ends in
//!   a printable character), `\s*[\r\n]+` can only end at this newline, the
//!   punctuation tail stops there too, and no alternative lets a letter run
//!   start at a newline. The only lookahead (`\s+(?!\S)`) is reached for
//!   whitespace runs without a newline, which the character before the
//!   newline keeps apart from the cut on one side and the piece holds whole
//!   on the other. So the matches of the whole text are those of the pieces;
//! - BPE works inside a pre-token, and the post-processor runs only when
//!   special tokens are added, which this path never does.
//!
//! Tests compare the pieces' ids with one pass over large mixed texts.

use rayon::prelude::*;
use serde_json::Value;

/// Below this many bytes a text is encoded in one pass: the pieces would
/// be too small to pay for the threads.
pub const PARALLEL_MIN_BYTES: usize = 8 * 1024;

/// Smallest piece worth a thread of its own.
const MIN_PIECE_BYTES: usize = 2 * 1024;

/// Regex pre-tokenizer patterns for which a safe point is a pre-token
/// boundary (module docs): Qwen2/Qwen3's and Qwen3.5/3.6's.
pub const SPLIT_SAFE_PATTERNS: &[&str] = &[
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Whether a tokenizer's ids may be computed piece by piece at safe points,
/// read from its `tokenizer.json` document: the pipeline of the module docs
/// and nothing else (any other tokenizer encodes in one pass).
pub fn is_split_safe(doc: &Value) -> bool {
    let normalizer_ok = match doc.get("normalizer") {
        None | Some(Value::Null) => true,
        Some(n) => n.get("type").and_then(Value::as_str) == Some("NFC"),
    };
    let model = doc.get("model");
    let plain_bpe = model.and_then(|m| m.get("type")).and_then(Value::as_str) == Some("BPE")
        && model
            .and_then(|m| m.get("dropout"))
            .is_none_or(Value::is_null);
    // Added tokens are matched on the raw text first: none may span a cut
    // or depend on the whitespace across it.
    let added_ok = doc
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|token| {
            let flag = |name: &str| token.get(name).and_then(Value::as_bool).unwrap_or(false);
            let content = token.get("content").and_then(Value::as_str).unwrap_or("");
            !content.contains('\n') && !flag("lstrip") && !flag("rstrip") && !flag("single_word")
        });
    normalizer_ok
        && doc.get("pre_tokenizer").is_some_and(pre_tokenizer_is_safe)
        && plain_bpe
        && added_ok
}

fn pre_tokenizer_is_safe(pre: &Value) -> bool {
    let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_owned);
    let byte_level_plain = |v: &Value| {
        kind(v).as_deref() == Some("ByteLevel")
            && v.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
            && v.get("use_regex").and_then(Value::as_bool) == Some(false)
    };
    let safe_split = |v: &Value| {
        kind(v).as_deref() == Some("Split")
            && v.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && v.get("invert").and_then(Value::as_bool) == Some(false)
            && v.get("pattern")
                .and_then(|p| p.get("Regex"))
                .and_then(Value::as_str)
                .is_some_and(|r| SPLIT_SAFE_PATTERNS.contains(&r))
    };
    if kind(pre).as_deref() != Some("Sequence") {
        return false;
    }
    match pre.get("pretokenizers").and_then(Value::as_array) {
        Some(steps) => steps.len() == 2 && safe_split(&steps[0]) && byte_level_plain(&steps[1]),
        None => false,
    }
}

/// Byte offsets of safe points that cut `text` into at most `pieces`
/// pieces of at least [`MIN_PIECE_BYTES`], near equal in size.
pub fn cut_points(text: &str, pieces: usize) -> Vec<usize> {
    let bytes = text.as_bytes();
    let pieces = pieces.min(bytes.len() / MIN_PIECE_BYTES).max(1);
    let step = bytes.len() / pieces;
    let mut cuts = Vec::with_capacity(pieces.saturating_sub(1));
    let mut from = 0;
    for i in 1..pieces {
        let target = (i * step).max(from + MIN_PIECE_BYTES);
        match next_safe_point(bytes, target) {
            Some(at) if bytes.len() - at >= MIN_PIECE_BYTES => {
                cuts.push(at);
                from = at;
            }
            _ => break,
        }
    }
    cuts
}

/// The first safe point at or after `from`.
fn next_safe_point(bytes: &[u8], from: usize) -> Option<usize> {
    // A safe point `at` has bytes[at - 1] == b'\n'; the bytes around it are
    // ASCII, so it is a char boundary of the UTF-8 text.
    let printable = |b: u8| (0x21..=0x7e).contains(&b);
    (from.max(2)..bytes.len()).find(|&at| {
        bytes[at - 1] == b'\n'
            && printable(bytes[at - 2])
            && bytes[at..]
                .iter()
                .find(|&&b| b != b' ' && b != b'\t')
                .is_some_and(|&b| printable(b))
    })
}

/// Encodes `text` (without special-token insertion) in pieces cut at safe
/// points, in parallel, with `encode` applied to each piece.
pub fn encode_in_pieces<E, Err>(text: &str, encode: E) -> Result<Vec<u32>, Err>
where
    E: Fn(&str) -> Result<Vec<u32>, Err> + Sync,
    Err: Send,
{
    let cuts = cut_points(text, rayon::current_num_threads());
    if cuts.is_empty() {
        return encode(text);
    }
    let bounds: Vec<(usize, usize)> = std::iter::once(0)
        .chain(cuts.iter().copied())
        .zip(cuts.iter().copied().chain(std::iter::once(text.len())))
        .collect();
    let parts: Vec<Vec<u32>> = bounds
        .par_iter()
        .map(|&(a, b)| encode(&text[a..b]))
        .collect::<Result<_, _>>()?;
    Ok(parts.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_points_fall_after_a_newline_between_non_whitespace() {
        let line = "def f(x):\n    return x\n";
        let text = line.repeat(2000);
        let cuts = cut_points(&text, 8);
        assert!(!cuts.is_empty() && cuts.len() <= 7, "{} cuts", cuts.len());
        for &c in &cuts {
            let b = text.as_bytes();
            assert_eq!(b[c - 1], b'\n');
            assert!(b[c - 2].is_ascii_graphic(), "cut {c} follows whitespace");
            let next = b[c..].iter().find(|&&x| x != b' ' && x != b'\t').unwrap();
            assert!(
                next.is_ascii_graphic(),
                "cut {c} precedes {:?}",
                *next as char
            );
        }
        assert!(cuts.windows(2).all(|w| w[1] - w[0] >= MIN_PIECE_BYTES));
    }

    #[test]
    fn short_or_cutless_texts_stay_whole() {
        assert!(cut_points("abc\ndef", 8).is_empty());
        // Newlines only before a blank line or after one: no safe point.
        let text = "    x = 1\n\n".repeat(3000);
        assert!(cut_points(&text, 8).is_empty());
        // Whitespace that holds another newline is not one either.
        let text = "    x = 1\n  \n".repeat(3000);
        assert!(cut_points(&text, 8).is_empty());
        // Indentation before a printable character is one.
        assert!(!cut_points(&"    x = 1\n".repeat(3000), 8).is_empty());
    }

    #[test]
    fn cut_points_never_split_a_multibyte_character() {
        let text = "é€😀;\nxé€😀\n".repeat(2000);
        let cuts = cut_points(&text, 16);
        assert!(!cuts.is_empty());
        for c in cuts {
            assert!(text.is_char_boundary(c));
        }
    }
}
