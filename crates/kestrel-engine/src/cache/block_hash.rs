//! Chain hashes identifying a full block of tokens together with its whole prefix.
//!
//! SHA-256 over (parent hash, block tokens): a cryptographic hash, so a client
//! cannot craft a prompt whose blocks collide with another tenant's cached
//! blocks (CVE-2025-25183 hit a server using Python's `hash`). The per-request
//! `cache_salt` seeds the root, so differently salted requests never share.

use sha2::{Digest, Sha256};

/// Identity of a block and everything before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    /// The hash every chain starts from, derived from the salt (empty for none).
    pub fn root(salt: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(b"kestrel prefix cache v1\0");
        h.update((salt.len() as u64).to_le_bytes());
        h.update(salt);
        Self(h.finalize().into())
    }

    /// The hash of `tokens` following the block hashed `self`.
    pub fn chain(&self, tokens: &[u32]) -> Self {
        let mut h = Sha256::new();
        h.update(self.0);
        for &t in tokens {
            h.update(t.to_le_bytes());
        }
        Self(h.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_depend_on_prefix_tokens_and_salt() {
        let root = BlockHash::root(b"");
        let a = root.chain(&[1, 2]);
        assert_eq!(a, BlockHash::root(b"").chain(&[1, 2]));
        assert_ne!(a, root.chain(&[2, 1]));
        // Same block after a different parent is a different block.
        assert_ne!(a.chain(&[3, 4]), root.chain(&[9, 9]).chain(&[3, 4]));
        assert_ne!(a, BlockHash::root(b"tenant").chain(&[1, 2]));
        // Token boundaries are fixed-width: [1, 2] and [0x201] differ.
        assert_ne!(root.chain(&[1, 2]), root.chain(&[0x0000_0201]));
    }
}
