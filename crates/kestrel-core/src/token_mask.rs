//! Allowed-token masks over rows of logits (structured outputs): a row's
//! mask is a bit per id, bit `id % 32` of word `id / 32` set where the id
//! may be sampled; every other id of the row, the ids past the mask's words
//! included, is set to `-inf`. Computed on the host by a grammar, applied
//! where the logits are, so a masked row can still take the device's argmax
//! or candidates.

/// The mask of one row of a step's logits.
#[derive(Clone, Copy, Debug)]
pub struct RowMask<'a> {
    /// The row of the logits.
    pub row: usize,
    /// A bit per id, set where the id is allowed.
    pub allowed: &'a [u32],
}

/// Whether `id` is allowed by `words`.
pub fn is_allowed(words: &[u32], id: usize) -> bool {
    words
        .get(id / 32)
        .is_some_and(|w| w & (1u32 << (id % 32)) != 0)
}

/// Words of a mask over `ids` ids.
pub fn mask_words(ids: usize) -> usize {
    ids.div_ceil(32)
}

/// Apply `masks` to host logits of rows of `row_len` values (the reference
/// of every backend's [`crate::Backend::mask_rows`]).
pub fn mask_rows_host(values: &mut [f32], row_len: usize, masks: &[RowMask<'_>]) {
    for mask in masks {
        let row = &mut values[mask.row * row_len..(mask.row + 1) * row_len];
        for (id, logit) in row.iter_mut().enumerate() {
            if !is_allowed(mask.allowed, id) {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_allowed_ids_of_the_masked_rows_keep_their_logits() {
        // Two rows of 40 ids: row 1 allows ids 0, 31 and 33; ids past the
        // mask's one word and a half are disallowed too.
        let mut values: Vec<f32> = (0..80).map(|i| i as f32).collect();
        let allowed = [1u32 | 1 << 31, 1 << 1];
        mask_rows_host(
            &mut values,
            40,
            &[RowMask {
                row: 1,
                allowed: &allowed[..1],
            }],
        );
        assert_eq!(
            values[..40],
            (0..40).map(|i| i as f32).collect::<Vec<_>>()[..]
        );
        let row1: Vec<usize> = (0..40).filter(|&i| values[40 + i].is_finite()).collect();
        assert_eq!(row1, [0, 31]);

        let mut values = vec![0.5f32; 40];
        mask_rows_host(
            &mut values,
            40,
            &[RowMask {
                row: 0,
                allowed: &allowed,
            }],
        );
        let row0: Vec<usize> = (0..40).filter(|&i| values[i].is_finite()).collect();
        assert_eq!(row0, [0, 31, 33]);
        assert!(is_allowed(&allowed, 33) && !is_allowed(&allowed, 34) && !is_allowed(&allowed, 64));
        assert_eq!(mask_words(33), 2);
    }
}
