//! Helpers for incremental tag matching over streamed text.

/// Byte length of the longest suffix of `text` that is a proper prefix of
/// one of `tags`: text that must be withheld because the next chunk may
/// complete a tag. Always ends on a char boundary.
pub(crate) fn partial_suffix_len(text: &str, tags: &[&str]) -> usize {
    let mut best = 0;
    for tag in tags {
        let max = tag.len().saturating_sub(1).min(text.len());
        for k in (best + 1..=max).rev() {
            if tag.is_char_boundary(k) && text.ends_with(&tag[..k]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// Earliest occurrence of any tag: (byte position, tag index).
pub(crate) fn find_first(text: &str, tags: &[&str]) -> Option<(usize, usize)> {
    tags.iter()
        .enumerate()
        .filter_map(|(i, t)| text.find(t).map(|p| (p, i)))
        .min_by_key(|&(p, i)| (p, std::cmp::Reverse(tags[i].len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffix_finds_longest_prefix() {
        assert_eq!(partial_suffix_len("abc<thi", &["<think>"]), 4);
        assert_eq!(partial_suffix_len("abc<", &["<think>", "</think>"]), 1);
        assert_eq!(partial_suffix_len("abc</", &["<think>", "</think>"]), 2);
        assert_eq!(partial_suffix_len("abc", &["<think>"]), 0);
        // A complete tag is not a partial one.
        assert_eq!(partial_suffix_len("<think>", &["<think>"]), 0);
        assert_eq!(partial_suffix_len("é<", &["<é>"]), 1);
    }

    #[test]
    fn find_first_prefers_earliest_then_longest() {
        assert_eq!(
            find_first("a</think>b<tool_call>", &["<tool_call>", "</think>"]),
            Some((1, 1))
        );
        assert_eq!(find_first("abcd", &["cd", "bcd"]), Some((1, 1)));
        assert_eq!(find_first("x", &["y"]), None);
    }
}
