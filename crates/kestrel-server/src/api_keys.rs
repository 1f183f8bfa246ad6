//! The accepted API keys, kept as SHA-256 digests and compared in constant
//! time, so neither a key's length nor its matching prefix leaks through
//! timing.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The digests of the accepted keys.
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl ApiKeys {
    pub fn new(keys: &[String]) -> Self {
        ApiKeys {
            digests: keys.iter().map(|k| digest(k.as_bytes())).collect(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        !self.digests.is_empty()
    }

    /// Whether `key` is one of the accepted keys. Every digest is compared,
    /// so the time does not depend on which one matches.
    pub fn accepts(&self, key: &str) -> bool {
        let given = digest(key.as_bytes());
        let mut ok = subtle::Choice::from(0u8);
        for d in &self.digests {
            ok |= d.ct_eq(&given);
        }
        ok.into()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_listed_keys() {
        let keys = ApiKeys::new(&["alpha".into(), "beta".into()]);
        assert!(keys.is_enabled());
        assert!(keys.accepts("alpha"));
        assert!(keys.accepts("beta"));
        assert!(!keys.accepts("alph"));
        assert!(!keys.accepts(""));
        assert!(!ApiKeys::new(&[]).accepts("alpha"));
    }
}
