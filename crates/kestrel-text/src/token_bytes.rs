//! The bytes one token stands for. Byte-level BPE vocabularies (GPT-2's,
//! Qwen's) spell every byte as one printable character: the printable
//! Latin-1 bytes as themselves, the other 68 bytes (controls, space, DEL,
//! NBSP, soft hyphen) as the characters from U+0100 on, in byte order. A
//! token's bytes are its spelling read back through that alphabet; they may
//! be part of a UTF-8 character, which decoding the token alone cannot show.

/// Whether `byte` is spelled as itself.
fn is_printable(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte spelled by `c` in the byte-level alphabet, if `c` is in it.
fn byte_of(c: char) -> Option<u8> {
    let code = u32::from(c);
    if let Ok(byte) = u8::try_from(code) {
        return is_printable(byte).then_some(byte);
    }
    let nth = code.checked_sub(0x100)? as usize;
    (0..=u8::MAX).filter(|&b| !is_printable(b)).nth(nth)
}

/// The bytes of a byte-level spelling, or `None` when a character is not
/// in the alphabet (another kind of vocabulary, or an added token).
pub(crate) fn byte_level_bytes(spelling: &str) -> Option<Vec<u8>> {
    spelling.chars().map(byte_of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_covers_every_byte_once() {
        let mut seen = [false; 256];
        for code in (0x21..=0xFFu32).chain(0x100..0x100 + 68) {
            let c = char::from_u32(code).unwrap();
            if let Some(b) = byte_of(c) {
                assert!(!seen[b as usize], "byte {b} twice");
                seen[b as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        // 'Ġ' (U+0120) is the space, 'Ċ' (U+010A) the newline.
        assert_eq!(byte_level_bytes("Ġhi"), Some(b" hi".to_vec()));
        assert_eq!(byte_level_bytes("Ċ"), Some(b"\n".to_vec()));
        assert_eq!(byte_level_bytes("<|im_end|>"), Some(b"<|im_end|>".to_vec()));
        assert_eq!(byte_level_bytes("\u{4e16}"), None);
    }
}
