//! Paged KV pools and recurrent-state slots.

use kestrel_core::{BackendError, CacheSpec, GdnSpec, Result};

/// One full-attention layer's paged pools, `[num_blocks, block_size, Hkv, D]` each.
#[derive(Clone, Debug)]
pub struct KvPool {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// One linear-attention layer's per-slot state.
#[derive(Clone, Debug)]
pub struct GdnState {
    /// `[slots, conv_kernel - 1, conv_dim]`: the last inputs of the causal conv.
    pub conv: Vec<f32>,
    /// `[slots, Hv, Dk, Dv]`: the delta-rule state.
    pub recurrent: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct CpuCache {
    pub spec: CacheSpec,
    pub kv: Vec<KvPool>,
    pub gdn: Vec<GdnState>,
}

impl CpuCache {
    pub fn new(spec: &CacheSpec) -> Result<Self> {
        if spec.attn_layers > 0
            && (spec.block_size == 0 || spec.num_kv_heads == 0 || spec.head_dim == 0)
        {
            return Err(BackendError::Invalid(format!(
                "KV cache needs non-zero block_size, num_kv_heads and head_dim, got {spec:?}"
            )));
        }
        let pool_len = checked_len(&[
            spec.num_blocks,
            spec.block_size,
            spec.num_kv_heads,
            spec.head_dim,
        ])?;
        let kv = (0..spec.attn_layers)
            .map(|_| {
                Ok(KvPool {
                    k: zeroed(pool_len)?,
                    v: zeroed(pool_len)?,
                })
            })
            .collect::<Result<_>>()?;
        let gdn = if spec.gdn_layers == 0 {
            Vec::new()
        } else {
            let g = spec.gdn.as_ref().ok_or_else(|| {
                BackendError::Invalid(format!("{} GDN layers but no GdnSpec", spec.gdn_layers))
            })?;
            if g.conv_kernel == 0
                || g.num_k_heads == 0
                || !g.num_v_heads.is_multiple_of(g.num_k_heads)
            {
                return Err(BackendError::Invalid(format!(
                    "GDN needs conv_kernel >= 1 and num_v_heads a multiple of num_k_heads, got {g:?}"
                )));
            }
            let conv_len = checked_len(&[spec.num_state_slots, g.conv_kernel - 1, g.conv_dim()])?;
            let rec_len = checked_len(&[
                spec.num_state_slots,
                g.num_v_heads,
                g.head_k_dim,
                g.head_v_dim,
            ])?;
            (0..spec.gdn_layers)
                .map(|_| {
                    Ok(GdnState {
                        conv: zeroed(conv_len)?,
                        recurrent: zeroed(rec_len)?,
                    })
                })
                .collect::<Result<_>>()?
        };
        Ok(CpuCache {
            spec: spec.clone(),
            kv,
            gdn,
        })
    }

    /// The GDN dims of this cache (always present when it has GDN layers).
    pub fn gdn_spec(&self) -> Option<&GdnSpec> {
        self.spec.gdn.as_ref()
    }

    pub fn conv_slot_len(&self) -> usize {
        self.gdn_spec().map_or(0, GdnSpec::conv_state_len)
    }

    pub fn recurrent_slot_len(&self) -> usize {
        self.gdn_spec().map_or(0, GdnSpec::recurrent_state_len)
    }

    fn check_slot(&self, slot: u32) {
        assert!(
            (slot as usize) < self.spec.num_state_slots || self.gdn.is_empty(),
            "state slot {slot} out of range (cache has {} slots)",
            self.spec.num_state_slots
        );
    }

    pub fn zero_state(&mut self, slot: u32) {
        self.check_slot(slot);
        let (cl, rl) = (self.conv_slot_len(), self.recurrent_slot_len());
        let s = slot as usize;
        for layer in &mut self.gdn {
            layer.conv[s * cl..(s + 1) * cl].fill(0.0);
            layer.recurrent[s * rl..(s + 1) * rl].fill(0.0);
        }
    }

    pub fn copy_state(&mut self, src: u32, dst: u32) {
        self.check_slot(src);
        self.check_slot(dst);
        if src == dst {
            return;
        }
        let (cl, rl) = (self.conv_slot_len(), self.recurrent_slot_len());
        let (s, d) = (src as usize, dst as usize);
        for layer in &mut self.gdn {
            layer.conv.copy_within(s * cl..(s + 1) * cl, d * cl);
            layer.recurrent.copy_within(s * rl..(s + 1) * rl, d * rl);
        }
    }
}

fn checked_len(dims: &[usize]) -> Result<usize> {
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| BackendError::OutOfMemory(format!("cache of dims {dims:?} overflows")))
}

/// A zero-filled buffer, or an error instead of an abort when memory is short.
fn zeroed(len: usize) -> Result<Vec<f32>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|e| BackendError::OutOfMemory(format!("{len} f32 values: {e}")))?;
    v.resize(len, 0.0);
    Ok(v)
}
