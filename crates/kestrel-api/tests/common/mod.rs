//! Chunkings of a text for streaming tests: whole, per character, and
//! seeded random splits (always on char boundaries).
#![allow(dead_code)]

/// Splits `text` every `n` characters.
pub fn split_every(text: &str, n: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(n.max(1)).map(|c| c.iter().collect()).collect()
}

/// Random splits from a small xorshift generator (deterministic per seed).
pub fn split_random(text: &str, seed: u64) -> Vec<String> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let len = 1 + (next() % 9) as usize;
        let end = (i + len).min(chars.len());
        out.push(chars[i..end].iter().collect());
        i = end;
    }
    out
}

/// Every chunking the streaming tests use.
pub fn chunkings(text: &str) -> Vec<Vec<String>> {
    let mut all = vec![
        vec![text.to_string()],
        split_every(text, 1),
        split_every(text, 2),
        split_every(text, 3),
    ];
    all.extend((0..12).map(|seed| split_random(text, seed)));
    all
}
