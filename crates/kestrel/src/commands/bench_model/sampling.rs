//! How a timed decode step picks its tokens: through the engine's token
//! chooser (`kestrel_engine::StepLogits`), so that bench-model measures the
//! path the server runs: the device argmax where every row is plain greedy,
//! else the sampler's candidate request, the device's best candidates
//! (`Backend::top_candidates`), the host's finish, and a copy of the whole
//! row when the candidates cannot decide (counted: dummy weights give flat
//! distributions, where that happens more often than on trained ones).

use anyhow::{Result, anyhow};
use kestrel_core::Backend;
use kestrel_engine::StepLogits;
use kestrel_sampling::{DEFAULT_MAX_CANDIDATES, Sampler, SamplingParams};

/// `--sampling`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SamplingMode {
    /// The device argmax.
    Greedy,
    /// Qwen's recommended settings: temperature 0.7, top-p 0.8, top-k 20.
    Qwen,
    /// Temperature 1 and no filter (the OpenAI API's defaults).
    Plain,
}

impl SamplingMode {
    /// The parameters of a sequence sampled this way, seeded with `seed`.
    pub fn params(self, seed: u64) -> SamplingParams {
        let base = SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        };
        match self {
            SamplingMode::Greedy => SamplingParams {
                temperature: 0.0,
                ..base
            },
            SamplingMode::Qwen => SamplingParams {
                temperature: 0.7,
                top_p: 0.8,
                top_k: 20,
                ..base
            },
            SamplingMode::Plain => base,
        }
    }
}

/// One decoding batch's token choice.
pub struct TokenChooser {
    /// Per sequence, its sampler and its tokens so far.
    seqs: Vec<(Sampler, Vec<u32>)>,
    /// Ids that may be chosen (`None`: the whole row).
    sampled_vocab: Option<usize>,
    /// Sampled tokens, and those that needed the whole row copied.
    pub sampled: usize,
    pub full_rows: usize,
}

impl TokenChooser {
    /// `histories`: each sequence's prompt and first generated token.
    pub fn new(
        mode: SamplingMode,
        histories: Vec<Vec<u32>>,
        sampled_vocab: Option<usize>,
    ) -> Result<Self> {
        let mut seqs = Vec::new();
        for (s, history) in histories.into_iter().enumerate() {
            let prompt_len = history.len().saturating_sub(1);
            let sampler = Sampler::new(&mode.params(s as u64 + 1), prompt_len, &[])
                .map_err(|e| anyhow!("sampling parameters: {e}"))?;
            seqs.push((sampler, history));
        }
        Ok(Self {
            seqs,
            sampled_vocab,
            sampled: 0,
            full_rows: 0,
        })
    }

    /// The next token of every row of `logits` (one row per sequence).
    pub fn choose<B: Backend>(&mut self, b: &B, logits: &B::Tensor) -> Result<Vec<u32>> {
        let step = StepLogits::new(b, logits, self.sampled_vocab);
        let rows = b.dims(logits).0.min(self.seqs.len());
        let seqs = &mut self.seqs[..rows];
        let all_plain_argmax = seqs.iter().all(|(s, h)| s.is_plain_argmax(h));
        let requests = if all_plain_argmax {
            Vec::new()
        } else {
            seqs.iter_mut()
                .enumerate()
                .map(|(r, (sampler, history))| {
                    sampler.candidate_request(
                        history,
                        r,
                        step.sampled_vocab,
                        DEFAULT_MAX_CANDIDATES,
                    )
                })
                .collect()
        };
        let sources = step.sources(requests, all_plain_argmax)?;
        let mut tokens = Vec::with_capacity(rows);
        for (source, (sampler, history)) in sources.into_iter().zip(seqs.iter_mut()) {
            let token = step
                .choose(source, sampler, history, &mut |_| {})?
                .map_err(|e| anyhow!("sampling: {e}"))?;
            history.push(token);
            tokens.push(token);
        }
        if !all_plain_argmax {
            self.sampled += tokens.len();
        }
        self.full_rows += step.rows_copied();
        Ok(tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_cpu::CpuBackend;

    /// Two rows of 300 logits with one clear winner each, and a flatter third.
    fn logits(b: &CpuBackend) -> kestrel_cpu::CpuTensor {
        let mut v: Vec<f32> = (0..900).map(|i| ((i * 37) % 101) as f32 * 0.01).collect();
        v[17] = 9.0;
        v[300 + 250] = 9.0;
        b.from_host(3, 300, &v)
    }

    #[test]
    fn greedy_takes_the_argmax() {
        let b = CpuBackend::new();
        let mut c = TokenChooser::new(SamplingMode::Greedy, vec![vec![1, 2]; 3], None).unwrap();
        let t = c.choose(&b, &logits(&b)).unwrap();
        assert_eq!(&t[..2], &[17, 250]);
        assert_eq!(c.sampled, 0);
    }

    #[test]
    fn padded_ids_are_never_chosen() {
        let b = CpuBackend::new();
        for mode in [SamplingMode::Greedy, SamplingMode::Qwen] {
            let mut c = TokenChooser::new(mode, vec![vec![1, 2]; 3], Some(200)).unwrap();
            for _ in 0..5 {
                let t = c.choose(&b, &logits(&b)).unwrap();
                assert_eq!(t[0], 17, "{mode:?}");
                assert!(t.iter().all(|&t| t < 200), "{mode:?}: {t:?}");
            }
        }
    }

    #[test]
    fn sampling_is_seeded_and_follows_the_filters() {
        let b = CpuBackend::new();
        let x = logits(&b);
        let run = |mode| {
            let mut c = TokenChooser::new(mode, vec![vec![1, 2]; 3], None).unwrap();
            let tokens: Vec<Vec<u32>> = (0..5).map(|_| c.choose(&b, &x).unwrap()).collect();
            assert_eq!(c.sampled, 15);
            tokens
        };
        let qwen = run(SamplingMode::Qwen);
        assert_eq!(qwen, run(SamplingMode::Qwen), "same seeds, same tokens");
        // A logit 9 against ones below 1.01 at temperature 0.7 and top-p 0.8:
        // the winner is the only token kept.
        for step in &qwen {
            assert_eq!(&step[..2], &[17, 250]);
            assert!(step[2] < 300);
        }
        let plain = run(SamplingMode::Plain);
        assert!(plain.iter().flatten().all(|&t| t < 300));
    }
}
