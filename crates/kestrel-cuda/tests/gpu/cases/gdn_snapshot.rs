//! A prefix-cache snapshot inside a pass (`SeqChunk::state_snapshot`): one
//! pass over a prompt with the snapshot must give, bit for bit on one
//! backend, what two passes split at the snapshot give, in its outputs, in
//! the live state and in the snapshot slot; and the CPU backend's within
//! tolerance. A snapshot on a chunk boundary of the chunked form (Dk = Dv =
//! 128) and one anywhere on the recurrence (64). The states are read through
//! their effect on one more token (a probe), as in `gdn_verify`.

use kestrel_core::{Backend, CacheSpec, ForwardBatch, GdnSpec, GdnWeights, HostTensor};
use kestrel_core::{Result, SeqChunk, StateSnapshot};

use super::gdn::{fresh_layer, gdn_cache, gdn_spec, random_weights, same_bits};
use super::{Ctx, Outputs};

/// The sequence with the snapshot: tokens, live slot, snapshot slot.
const SNAPSHOT_SEQ: (usize, u32, u32) = (200, 0, 3);
/// A sequence beside it in the same step: tokens, slot.
const BESIDE: (usize, u32) = (70, 1);
const PROBE_SLOT: u32 = 5;

pub fn gdn_snapshot(c: &mut Ctx, prefix: &str, tol: f64) {
    for (hk, hv, d, after) in [(2, 4, 128, 128), (2, 4, 128, 64), (2, 4, 64, 77)] {
        let spec = gdn_spec(hk, hv, d);
        let case = Case::new(c, spec, after);
        let cpu = case.one_pass(&c.cpu);
        let gpu = case.one_pass(&c.gpu).and_then(|one| {
            let two = case.two_passes(&c.gpu)?;
            same_bits(
                &one,
                &two,
                "one pass with the snapshot and two passes split there",
            )?;
            Ok(one)
        });
        c.record(
            &format!("{prefix}gdn snapshot inside a pass Hk{hk} Hv{hv} D{d} after {after}"),
            tol,
            cpu,
            gpu,
        );
    }
}

struct Case {
    spec: GdnSpec,
    cache: CacheSpec,
    w: GdnWeights<HostTensor<'static>>,
    after: usize,
    rows: Vec<f32>,
    beside: Vec<f32>,
    probe: Vec<f32>,
}

impl Case {
    fn new(c: &mut Ctx, spec: GdnSpec, after: usize) -> Self {
        let width = spec.proj_width();
        Case {
            spec,
            cache: gdn_cache(spec, 8),
            w: random_weights(c, &spec),
            after,
            rows: c.data.randn(SNAPSHOT_SEQ.0 * width, 1.0),
            beside: c.data.randn(BESIDE.0 * width, 1.0),
            probe: c.data.randn(width, 1.0),
        }
    }

    fn layer<B: Backend>(
        &self,
        b: &B,
        w: &GdnWeights<B::Weight>,
        cache: &mut B::Cache,
        seqs: Vec<SeqChunk>,
        x: &[f32],
    ) -> Vec<f32> {
        let batch = ForwardBatch { seqs };
        let proj = b.from_host(batch.num_tokens(), self.spec.proj_width(), x);
        b.to_host(&b.gated_delta_net(&proj, w, &self.spec, cache, 1, &batch))
    }

    /// The probes of the snapshot slot and the live slot.
    fn probes<B: Backend>(
        &self,
        b: &B,
        w: &GdnWeights<B::Weight>,
        cache: &mut B::Cache,
        snapshot: u32,
    ) -> Outputs {
        let (_, live, _) = SNAPSHOT_SEQ;
        [("snapshot", snapshot), ("live state", live)]
            .into_iter()
            .map(|(name, slot)| {
                b.copy_state(cache, slot, PROBE_SLOT);
                let out = self.layer(
                    b,
                    w,
                    cache,
                    vec![SeqChunk::new(1, 0, vec![], PROBE_SLOT)],
                    &self.probe,
                );
                (name.to_string(), out)
            })
            .collect()
    }

    fn one_pass<B: Backend>(&self, b: &B) -> Result<Outputs> {
        let (w, mut cache) = fresh_layer(b, &self.w, &self.cache)?;
        let (n, live, snap) = SNAPSHOT_SEQ;
        let after = self.after;
        let seqs = vec![
            SeqChunk {
                prompt: false,
                state_snapshot: Some(StateSnapshot {
                    after,
                    slot: Some(snap),
                }),
                ..SeqChunk::new(n, 0, vec![], live)
            },
            SeqChunk::new(BESIDE.0, 0, vec![], BESIDE.1),
        ];
        let x = [self.rows.as_slice(), &self.beside].concat();
        let out = self.layer(b, &w, &mut cache, seqs, &x);
        let mut outs = vec![("pass".to_string(), out)];
        outs.extend(self.probes(b, &w, &mut cache, snap));
        Ok(outs)
    }

    fn two_passes<B: Backend>(&self, b: &B) -> Result<Outputs> {
        let (w, mut cache) = fresh_layer(b, &self.w, &self.cache)?;
        let (n, live, snap) = SNAPSHOT_SEQ;
        let (after, width) = (self.after, self.spec.proj_width());
        let first = vec![
            SeqChunk::new(after, 0, vec![], live),
            SeqChunk::new(BESIDE.0, 0, vec![], BESIDE.1),
        ];
        let x = [&self.rows[..after * width], self.beside.as_slice()].concat();
        let out1 = self.layer(b, &w, &mut cache, first, &x);
        b.copy_state(&mut cache, live, snap);
        let out2 = self.layer(
            b,
            &w,
            &mut cache,
            vec![SeqChunk::new(n - after, after, vec![], live)],
            &self.rows[after * width..],
        );
        // In the one pass's row order: the sequence's rows, then the other's.
        let value = out1.len() / (after + BESIDE.0);
        let mut out = out1[..after * value].to_vec();
        out.extend(&out2);
        out.extend(&out1[after * value..]);
        let mut outs = vec![("pass".to_string(), out)];
        outs.extend(self.probes(b, &w, &mut cache, snap));
        Ok(outs)
    }
}
