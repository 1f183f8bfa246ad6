//! Shared helpers of the engine tests: the models, small engine
//! configurations, request builders and stream collection.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{NgramConfig, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{
    Engine, EngineConfig, EngineEvent, EngineHandle, EngineStats, GenerateRequest, LogitsObserver,
    RequestStream, Usage,
};
use kestrel_models::flash_next::FlashNext;
use kestrel_models::{Model, Target};
use kestrel_sampling::{FinishReason, SamplingParams};

#[derive(Clone, Copy, Debug)]
pub enum TestModel {
    /// Random-weight Qwen3-MoE (attention only), vocab 512.
    Moe,
    /// Random-weight Qwen3.5-MoE (hybrid: Gated DeltaNet + attention), vocab 512.
    HybridGolden,
    /// The bundled trained hybrid model, vocab 4096.
    Bundled,
    /// Random-weight Qwen3.8-Flash-Next (hyper-connections, PLE, sparse
    /// attention with an indexer budget of 16 tokens), vocab 512.
    FlashNext,
}

impl TestModel {
    pub fn dir(self) -> PathBuf {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        match self {
            TestModel::Moe => root.join("testdata/golden/qwen3_moe/model"),
            TestModel::HybridGolden => root.join("testdata/golden/qwen3_5_moe/model"),
            TestModel::Bundled => root.join("models/kestrel-tiny-qwen35"),
            TestModel::FlashNext => root.join("testdata/golden/qwen4_exp/model"),
        }
    }

    /// The model on the shared decoder (not Flash-Next: see [`Self::target`]).
    pub fn load(self) -> Model<CpuBackend> {
        Model::load(&self.dir(), &CpuBackend::new())
            .unwrap_or_else(|e| panic!("cannot load {self:?}: {e:#}"))
    }

    /// What the engine runs, for every test model.
    pub fn target(self) -> Target<CpuBackend> {
        match self {
            TestModel::FlashNext => FlashNext::load(&self.dir(), &CpuBackend::new())
                .unwrap_or_else(|e| panic!("cannot load {self:?}: {e:#}"))
                .into(),
            _ => self.load().into(),
        }
    }

    pub fn has_mtp_head(self) -> bool {
        !matches!(self, TestModel::Moe | TestModel::FlashNext)
    }

    /// A DFlash drafter folder made for this model, if there is one (a
    /// random one for the hybrid golden model, testdata/dflash).
    pub fn dflash_drafter(self) -> Option<PathBuf> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        matches!(self, TestModel::HybridGolden).then(|| root.join("testdata/dflash/drafter"))
    }

    pub fn is_hybrid(self) -> bool {
        !matches!(self, TestModel::Moe)
    }

    pub fn vocab(self) -> u32 {
        match self {
            TestModel::Bundled => 4096,
            _ => 512,
        }
    }
}

/// A small engine: pages of 16 tokens, 4 sequences, 160 tokens per step
/// (prefill grid of 144, so chunks reach the chunked Gated DeltaNet form).
pub fn config() -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_queued_requests: 64,
        max_num_batched_tokens: 160,
        block_size: 16,
        num_blocks: 96,
        num_state_slots: 24,
        enable_prefix_cache: true,
        max_model_len: 640,
        force_preempt_at: None,
        sampled_vocab: None,
    }
}

/// The three ways of serving that a test of the engine's step shapes runs:
/// plain, n-gram speculation (4 drafts) and a preemption forced at step 2.
pub fn serving_variants() -> [(&'static str, EngineConfig, Option<SpeculativeConfig>); 3] {
    let ngram = SpeculativeConfig {
        method: SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap()),
        num_speculative_tokens: 4,
    };
    let preempting = EngineConfig {
        force_preempt_at: Some(2),
        ..config()
    };
    [
        ("plain", config(), None),
        ("n-gram speculation", config(), Some(ngram)),
        ("forced preemption", preempting, None),
    ]
}

pub fn spawn(model: TestModel, config: EngineConfig) -> EngineHandle {
    Engine::spawn(CpuBackend::new(), model.target(), config).expect("engine starts")
}

/// A logits row as bit patterns, with the id of its request.
type RecordedRow = (String, Vec<u32>);

/// Every logits row an engine sampled from, in order.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<Vec<RecordedRow>>>);

pub type LogitsByRequest = BTreeMap<String, Vec<Vec<u32>>>;

impl Recorder {
    pub fn observer(&self) -> LogitsObserver {
        let rows = Arc::clone(&self.0);
        Box::new(move |id, row| {
            let bits = row.iter().map(|x| x.to_bits()).collect();
            rows.lock().unwrap().push((id.to_string(), bits));
        })
    }

    /// The rows recorded since the last call, grouped by request id.
    pub fn take(&self) -> LogitsByRequest {
        let mut by_id = LogitsByRequest::new();
        for (id, row) in self.0.lock().unwrap().drain(..) {
            by_id.entry(id).or_default().push(row);
        }
        by_id
    }
}

pub fn spawn_recorded(model: TestModel, config: EngineConfig) -> (EngineHandle, Recorder) {
    let recorder = Recorder::default();
    let engine = Engine::spawn_with_logits_observer(
        CpuBackend::new(),
        model.target(),
        config,
        recorder.observer(),
    )
    .expect("engine starts");
    (engine, recorder)
}

/// The part of a recording whose request ids pass `keep`.
pub fn only(rows: &LogitsByRequest, keep: impl Fn(&str) -> bool) -> LogitsByRequest {
    rows.iter()
        .filter(|(id, _)| keep(id))
        .map(|(id, r)| (id.clone(), r.clone()))
        .collect()
}

/// Bitwise equality of two recordings, reporting the first difference briefly.
pub fn assert_same_logits(got: &LogitsByRequest, want: &LogitsByRequest, what: &str) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: requests"
    );
    for (id, rows) in want {
        let got_rows = &got[id];
        assert_eq!(got_rows.len(), rows.len(), "{what}: {id}: number of steps");
        for (step, (g, w)) in got_rows.iter().zip(rows).enumerate() {
            if let Some(i) = g.iter().zip(w).position(|(a, b)| a != b) {
                panic!(
                    "{what}: {id}: logits differ at token {step}, id {i}: {} vs {}",
                    f32::from_bits(g[i]),
                    f32::from_bits(w[i])
                );
            }
        }
    }
}

/// Greedy, ignoring EOS, exactly `n` tokens.
pub fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        max_tokens: Some(n),
        ..SamplingParams::greedy()
    }
}

pub fn request(prompt: &[u32], params: SamplingParams) -> GenerateRequest {
    named("test", prompt, params)
}

pub fn named(id: &str, prompt: &[u32], params: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        prompt_ids: prompt.to_vec(),
        params,
        cache_salt: Vec::new(),
        constraint: None,
    }
}

/// A deterministic pseudo-random prompt of ids in `3..vocab`.
pub fn prompt(seed: u64, len: usize, vocab: u32) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            3 + (state % u64::from(vocab - 3)) as u32
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct Output {
    pub tokens: Vec<u32>,
    pub reason: FinishReason,
    pub usage: Usage,
}

/// Read a stream to its end; an `Error` event fails the test.
pub fn collect(stream: &mut RequestStream) -> Output {
    collect_from(stream, Vec::new())
}

pub fn collect_from(stream: &mut RequestStream, mut tokens: Vec<u32>) -> Output {
    loop {
        match stream.blocking_recv() {
            Some(EngineEvent::Tokens(t)) => tokens.extend(t),
            Some(EngineEvent::Finished { reason, usage, .. }) => {
                assert_eq!(stream.blocking_recv(), None, "nothing after Finished");
                assert_eq!(usage.completion_tokens, tokens.len());
                return Output {
                    tokens,
                    reason,
                    usage,
                };
            }
            Some(EngineEvent::Error(e)) => panic!("request failed: {e}"),
            Some(EngineEvent::Logprobs(_) | EngineEvent::PromptLogprobs(_)) => {}
            None => panic!("stream closed without a terminal event"),
        }
    }
}

/// Read `n` token events (requests must generate at least that many).
pub fn take_tokens(stream: &mut RequestStream, n: usize) -> Vec<u32> {
    let mut tokens = Vec::new();
    while tokens.len() < n {
        match stream.blocking_recv() {
            Some(EngineEvent::Tokens(t)) => tokens.extend(t),
            other => panic!("expected tokens, got {other:?}"),
        }
    }
    tokens
}

pub fn run_one(engine: &EngineHandle, req: GenerateRequest) -> Output {
    collect(&mut engine.submit(req).expect("submitted"))
}

/// Submit the requests one after another, each once the previous one has
/// produced its first token (so they overlap but arrive at different steps),
/// then collect every output.
pub fn run_staggered(engine: &EngineHandle, reqs: &[GenerateRequest]) -> Vec<Output> {
    let mut streams = Vec::new();
    for req in reqs {
        let mut stream = engine.submit(req.clone()).expect("submitted");
        let first = take_tokens(&mut stream, 1);
        streams.push((stream, first));
    }
    streams
        .into_iter()
        .map(|(mut s, first)| collect_from(&mut s, first))
        .collect()
}

/// Submit every request at once, then collect.
pub fn run_together(engine: &EngineHandle, reqs: &[GenerateRequest]) -> Vec<Output> {
    let mut streams: Vec<RequestStream> = reqs
        .iter()
        .map(|r| engine.submit(r.clone()).expect("submitted"))
        .collect();
    streams.iter_mut().map(collect).collect()
}

/// Wait until the engine has no request left, then check that every page
/// and slot is free or held only by the prefix cache.
pub fn wait_idle(engine: &EngineHandle) -> EngineStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = engine.stats();
        if s.num_running == 0 && s.num_waiting == 0 {
            assert_eq!(
                s.num_free_blocks + s.num_cached_blocks,
                s.num_total_blocks,
                "pages leaked: {s:?}"
            );
            assert_eq!(
                s.num_free_state_slots + s.num_cached_state_slots,
                s.num_total_state_slots,
                "state slots leaked: {s:?}"
            );
            return s;
        }
        assert!(Instant::now() < deadline, "engine never went idle: {s:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Poll the stats until `pred` holds (or fail after a while).
pub fn wait_for(engine: &EngineHandle, what: &str, pred: impl Fn(&EngineStats) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !pred(&engine.stats()) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}
