//! Speculative verification on a GDN layer: a chunk of 1 + k tokens with
//! state checkpoints (`SeqChunk::state_checkpoints`) must give, token for
//! token, what k + 1 one-token steps give, bit for bit on one backend, and
//! each checkpoint slot must hold the state after its token. The states are
//! read through their effect: a copy of each into a probe slot takes one more
//! token, whose output depends on the whole recurrent and conv state.

use kestrel_core::{Backend, CacheSpec, ForwardBatch, GdnSpec, GdnWeights, HostTensor};
use kestrel_core::{Result, SeqChunk};

use super::gdn::{fresh_layer, gdn_cache, gdn_spec, random_weights, same_bits};
use super::{Ctx, Outputs};

/// Sequences of the verify step: (prefill tokens, live slot, verify tokens,
/// checkpoint slots). The second one decodes plainly beside the others.
const SEQS: [(usize, u32, usize, &[u32]); 3] =
    [(37, 0, 4, &[2, 3, 4]), (5, 1, 1, &[]), (20, 5, 3, &[6, 7])];
const PROBE_SLOT: u32 = 11;

/// For each Hv/Hk group of the decode kernel and a head size of the general
/// kernels: the verify step against the CPU backend, and on CUDA against
/// consecutive one-token steps (bit for bit). Then the same verify step
/// beside a long prefill chunk, against the CPU backend.
pub fn gdn_verify(c: &mut Ctx, prefix: &str, tol: f64) {
    for (hk, hv, d) in [(2, 4, 128), (1, 4, 128), (4, 4, 128), (2, 4, 64)] {
        let spec = gdn_spec(hk, hv, d);
        let case = Case::new(c, spec, false);
        let cpu = case.verify(&c.cpu);
        let gpu = case.verify(&c.gpu).and_then(|v| {
            let seq = case.sequential(&c.gpu)?;
            same_bits(&v, &seq, "the verify step and one-token steps")?;
            Ok(v)
        });
        c.record(
            &format!("{prefix}gdn verify Hk{hk} Hv{hv} D{d}"),
            tol,
            cpu,
            gpu,
        );
    }
    let spec = gdn_spec(2, 4, 128);
    let case = Case::new(c, spec, true);
    let (cpu, gpu) = (case.verify(&c.cpu), case.verify(&c.gpu));
    c.record(
        &format!("{prefix}gdn verify beside a prefill Hk2 Hv4 D128"),
        tol,
        cpu,
        gpu,
    );
}

struct Case {
    spec: GdnSpec,
    cache: CacheSpec,
    w: GdnWeights<HostTensor<'static>>,
    /// Each sequence's prefill rows, then its verify rows.
    prefill: Vec<Vec<f32>>,
    verify: Vec<Vec<f32>>,
    probe: Vec<f32>,
    /// A 40-token prefill chunk of another sequence (slot 9) in the verify step.
    beside: Option<Vec<f32>>,
}

impl Case {
    fn new(c: &mut Ctx, spec: GdnSpec, beside_prefill: bool) -> Self {
        let width = spec.proj_width();
        let mut rows = |n: usize| c.data.randn(n * width, 1.0);
        let prefill = SEQS.iter().map(|s| rows(s.0)).collect();
        let verify = SEQS.iter().map(|s| rows(s.2)).collect();
        let probe = rows(1);
        let beside = beside_prefill.then(|| rows(40));
        let w = random_weights(c, &spec);
        Case {
            spec,
            cache: gdn_cache(spec, 12),
            w,
            prefill,
            verify,
            probe,
            beside,
        }
    }

    /// A fresh cache (all slots zero) after every sequence's prefill.
    fn start<B: Backend>(&self, b: &B) -> Result<(GdnWeights<B::Weight>, B::Cache)> {
        let (w, mut cache) = fresh_layer(b, &self.w, &self.cache)?;
        let chunks: Vec<(usize, u32, &[u32])> = SEQS.iter().map(|s| (s.0, s.1, &[][..])).collect();
        self.layer(b, &w, &mut cache, &chunks, &self.prefill.concat());
        Ok((w, cache))
    }

    fn layer<B: Backend>(
        &self,
        b: &B,
        w: &GdnWeights<B::Weight>,
        cache: &mut B::Cache,
        chunks: &[(usize, u32, &[u32])],
        x: &[f32],
    ) -> Vec<f32> {
        let batch = ForwardBatch {
            seqs: chunks
                .iter()
                .map(|&(n, slot, ckpts)| SeqChunk {
                    prompt: false,
                    num_tokens: n,
                    cached_len: 0,
                    block_table: vec![],
                    state_slot: slot,
                    state_checkpoints: ckpts.to_vec(),
                    state_snapshot: None,
                })
                .collect(),
        };
        let proj = b.from_host(batch.num_tokens(), self.spec.proj_width(), x);
        b.to_host(&b.gated_delta_net(&proj, w, &self.spec, cache, 1, &batch))
    }

    /// One more token from a copy of `slot`'s state.
    fn probe<B: Backend>(
        &self,
        b: &B,
        w: &GdnWeights<B::Weight>,
        cache: &mut B::Cache,
        slot: u32,
    ) -> Vec<f32> {
        b.copy_state(cache, slot, PROBE_SLOT);
        self.layer(b, w, cache, &[(1, PROBE_SLOT, &[])], &self.probe)
    }

    /// The verify step, then a probe of every checkpoint and live slot.
    fn verify<B: Backend>(&self, b: &B) -> Result<Outputs> {
        let (w, mut cache) = self.start(b)?;
        let mut chunks: Vec<(usize, u32, &[u32])> = SEQS.iter().map(|s| (s.2, s.1, s.3)).collect();
        let mut x = self.verify.concat();
        if let Some(rows) = &self.beside {
            chunks.insert(1, (40, 9, &[]));
            let at = SEQS[0].2 * self.spec.proj_width();
            x.splice(at..at, rows.iter().copied());
        }
        let mut outs = vec![(
            "verify step".to_string(),
            self.layer(b, &w, &mut cache, &chunks, &x),
        )];
        for (_, live, n, ckpts) in SEQS {
            for (i, &slot) in ckpts.iter().chain(std::iter::once(&live)).enumerate() {
                let after = if i < ckpts.len() { i } else { n - 1 };
                let state = self.probe(b, &w, &mut cache, slot);
                outs.push((format!("state of slot {live} after token {after}"), state));
            }
        }
        Ok(outs)
    }

    /// The same tokens as one-token steps, in the verify step's output order.
    fn sequential<B: Backend>(&self, b: &B) -> Result<Outputs> {
        let (w, mut cache) = self.start(b)?;
        let width = self.spec.proj_width();
        let longest = SEQS.iter().map(|s| s.2).max().unwrap_or(0);
        let mut rows: Vec<Vec<Vec<f32>>> = SEQS.iter().map(|_| Vec::new()).collect();
        let mut states: Vec<Vec<Vec<f32>>> = SEQS.iter().map(|_| Vec::new()).collect();
        for j in 0..longest {
            let live: Vec<usize> = (0..SEQS.len()).filter(|&i| j < SEQS[i].2).collect();
            let chunks: Vec<(usize, u32, &[u32])> =
                live.iter().map(|&i| (1, SEQS[i].1, &[][..])).collect();
            let x: Vec<f32> = live
                .iter()
                .flat_map(|&i| self.verify[i][j * width..(j + 1) * width].to_vec())
                .collect();
            let out = self.layer(b, &w, &mut cache, &chunks, &x);
            let value = out.len() / live.len();
            for (k, &i) in live.iter().enumerate() {
                rows[i].push(out[k * value..(k + 1) * value].to_vec());
                let state = self.probe(b, &w, &mut cache, SEQS[i].1);
                states[i].push(state);
            }
        }
        let mut outs = vec![("verify step".to_string(), rows.concat().concat())];
        for (i, (_, live, _, _)) in SEQS.iter().enumerate() {
            for (after, state) in states[i].iter().enumerate() {
                outs.push((
                    format!("state of slot {live} after token {after}"),
                    state.clone(),
                ));
            }
        }
        Ok(outs)
    }
}
