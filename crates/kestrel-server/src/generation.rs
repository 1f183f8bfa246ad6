//! One request's generation as text: engine token events -> UTF-8 safe
//! detokenised deltas -> stop strings. Chat and completions build on this;
//! dropping a [`TextGeneration`] drops the engine stream, which aborts the
//! request in the engine.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use kestrel_api::stop::StopMatcher;
use kestrel_api::types::{FinishReason, GeneratedLogprob, Usage};
use kestrel_api::{ApiError, GenerationParams};
use kestrel_engine::{
    Constraint, EngineEvent, GenerateRequest, PromptTokenLogprobs, RequestStream,
};
use kestrel_sampling::{SamplingParams, TokenLogprobs};
use kestrel_text::{Detokenizer, Tokenizer};

use crate::error::{ServerError, ServerResult};
use crate::state::{AppState, LoadedModel};
use crate::timing::FirstTokenClock;

/// What a [`TextGeneration`] yields, in order: text pieces (each token's
/// logprobs before the text it adds, when asked for), then exactly one
/// `Finished` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Text(String),
    /// The logprobs of the tokens generated since the last `Logprobs`.
    Logprobs(Vec<GeneratedLogprob>),
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    Failed(String),
}

/// The engine's sampling parameters for a validated request.
pub fn sampling_params(p: &GenerationParams, max_tokens: u32) -> ServerResult<SamplingParams> {
    let params = SamplingParams {
        temperature: p.temperature,
        top_k: i32::try_from(p.top_k).unwrap_or(i32::MAX),
        top_p: p.top_p,
        min_p: p.min_p,
        repetition_penalty: p.repetition_penalty,
        presence_penalty: p.presence_penalty,
        frequency_penalty: p.frequency_penalty,
        seed: p.seed,
        stop_token_ids: p.stop_token_ids.clone(),
        ignore_eos: p.ignore_eos,
        max_tokens: Some(max_tokens as usize),
        min_tokens: p.min_tokens as usize,
        logprobs: p.logprobs.map(|n| n as usize),
        prompt_logprobs: p.prompt_logprobs.map(|n| n as usize),
    };
    params
        .validate()
        .map_err(|e| ApiError::invalid(e.param, e.to_string()))?;
    Ok(params)
}

pub struct TextGeneration {
    state: Arc<AppState>,
    request_id: String,
    stream: Option<RequestStream>,
    detok: Detokenizer,
    stop: StopMatcher,
    prompt_tokens: usize,
    completion_tokens: usize,
    queue: VecDeque<Step>,
    started: Instant,
    last_token_at: Option<Instant>,
    clock: FirstTokenClock,
    /// The stop string that ended the generation, if one did.
    matched_stop: Option<String>,
    /// Whether the outcome went into the metrics already.
    recorded: bool,
    /// Names the tokens of the logprobs; `None` when none were asked for.
    logprobs_tokenizer: Option<Tokenizer>,
    /// Logprobs from the engine whose tokens have not arrived yet.
    pending_logprobs: VecDeque<TokenLogprobs>,
    /// Characters of text decoded so far (the next token's `text_offset`).
    decoded_chars: usize,
    /// The prompt logprobs received so far (see [`Self::take_prompt_logprobs`]).
    prompt_logprobs: Vec<PromptTokenLogprobs>,
}

/// Everything a generation produced (non-streaming responses).
pub struct Collected {
    pub text: String,
    pub reason: FinishReason,
    pub usage: Usage,
    /// The stop string that ended the text, if any.
    pub stop_sequence: Option<String>,
    /// One per generated token, when logprobs were asked for.
    pub logprobs: Vec<GeneratedLogprob>,
}

impl TextGeneration {
    /// Submits the request; a full queue is 429, a request the engine can
    /// never run is 400, a stopped engine 503. `received`: when the handler
    /// got the request (the origin of the timing events).
    /// `constraint`: which tokens may be generated (structured outputs).
    #[allow(clippy::too_many_arguments)]
    pub fn submit(
        state: &Arc<AppState>,
        model: &LoadedModel,
        request_id: String,
        prompt_ids: Vec<u32>,
        params: SamplingParams,
        generation_params: &GenerationParams,
        received: Instant,
        constraint: Option<Constraint>,
    ) -> ServerResult<Self> {
        let request = GenerateRequest {
            request_id,
            prompt_ids,
            params,
            cache_salt: Vec::new(),
            constraint,
        };
        let request_id = request.request_id.clone();
        let prompt_ids = &request.prompt_ids;
        crate::timing::prompt_ready(&request_id, received, prompt_ids.len());
        let detok = Detokenizer::with_context(
            &model.tokenizer,
            generation_params.skip_special_tokens,
            prompt_ids,
        );
        let prompt_tokens = prompt_ids.len();
        let logprobs_tokenizer = request
            .params
            .logprobs
            .is_some()
            .then(|| model.tokenizer.clone());
        let stream = model.engine.submit(request)?;
        Ok(TextGeneration {
            state: state.clone(),
            request_id,
            stream: Some(stream),
            detok,
            stop: StopMatcher::new(
                generation_params.stop.clone(),
                generation_params.include_stop_str_in_output,
            ),
            prompt_tokens,
            completion_tokens: 0,
            queue: VecDeque::new(),
            started: Instant::now(),
            last_token_at: None,
            clock: FirstTokenClock::new(received),
            matched_stop: None,
            recorded: false,
            logprobs_tokenizer,
            pending_logprobs: VecDeque::new(),
            decoded_chars: 0,
            prompt_logprobs: Vec::new(),
        })
    }

    /// The next step; `None` after the final one. Cancel-safe: a step is
    /// never lost if the future is dropped while waiting for the engine.
    /// Runs the generation to its end (non-streaming responses) and returns
    /// `prefix` followed by all generated text, the finish reason and usage.
    /// Dropping the future (the client went away) aborts the request.
    pub async fn collect(self, prefix: String) -> ServerResult<(String, FinishReason, Usage)> {
        let (text, reason, usage, _) = self.collect_with_stop(prefix).await?;
        Ok((text, reason, usage))
    }

    /// [`Self::collect`], plus the stop string that ended the text, if any
    /// (Anthropic's `stop_sequence`).
    pub async fn collect_with_stop(
        self,
        prefix: String,
    ) -> ServerResult<(String, FinishReason, Usage, Option<String>)> {
        let c = self.collect_all(prefix).await?;
        Ok((c.text, c.reason, c.usage, c.stop_sequence))
    }

    /// [`Self::collect_with_stop`], plus the logprobs.
    pub async fn collect_all(mut self, prefix: String) -> ServerResult<Collected> {
        let mut text = prefix;
        let mut logprobs = Vec::new();
        while let Some(step) = self.next().await {
            match step {
                Step::Text(t) => text.push_str(&t),
                Step::Logprobs(l) => logprobs.extend(l),
                Step::Finished { reason, usage } => {
                    return Ok(Collected {
                        text,
                        reason,
                        usage,
                        stop_sequence: self.matched_stop.take(),
                        logprobs,
                    });
                }
                Step::Failed(msg) => return Err(failure(msg)),
            }
        }
        Err(ServerError::internal(
            "the generation ended without a result",
        ))
    }

    /// Waits until the engine has computed the prompt (the first token, or
    /// the end, has arrived); what arrived stays queued for [`Self::next`].
    /// Other choices of the same prompt submitted after this find its pages
    /// in the prefix cache.
    pub async fn prefilled(&mut self) {
        while self.completion_tokens == 0 && self.queue.is_empty() && self.stream.is_some() {
            self.receive().await;
        }
    }

    /// The prompt logprobs (prompt positions 1 onwards), once
    /// [`Self::prefilled`] returned: the engine sends them all before the
    /// first token.
    pub fn take_prompt_logprobs(&mut self) -> Vec<PromptTokenLogprobs> {
        std::mem::take(&mut self.prompt_logprobs)
    }

    pub async fn next(&mut self) -> Option<Step> {
        loop {
            if let Some(step) = self.queue.pop_front() {
                return Some(step);
            }
            self.stream.as_ref()?;
            self.receive().await;
        }
    }

    /// Waits for one engine event and queues what it yields.
    async fn receive(&mut self) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        let event = stream.recv().await;
        match event {
            Some(EngineEvent::Logprobs(l)) => self.pending_logprobs.extend(l),
            Some(EngineEvent::PromptLogprobs(l)) => self.prompt_logprobs.extend(l),
            Some(EngineEvent::Tokens(ids)) => self.on_tokens(&ids),
            Some(EngineEvent::Finished { reason, usage, .. }) => {
                let tail = self.detok.finish();
                let d = self.stop.push(&tail);
                let mut text = d.text;
                let reason = if let Some(i) = d.stopped {
                    self.matched_stop = self.stop.stop_string(i).map(str::to_string);
                    FinishReason::Stop
                } else {
                    text.push_str(&self.stop.finish());
                    engine_reason(reason)
                };
                let usage = Usage::new(
                    usage.prompt_tokens as u32,
                    usage.completion_tokens as u32,
                    Some(usage.cached_tokens as u32),
                );
                self.end(text, Step::Finished { reason, usage });
            }
            Some(EngineEvent::Error(msg)) => self.end(String::new(), Step::Failed(msg)),
            None => self.end(
                String::new(),
                Step::Failed("the engine stopped before the request finished".into()),
            ),
        }
    }

    /// The stop string that ended the generation, once it has ended on one.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.matched_stop.as_deref()
    }

    /// The SSE writer is about to send an event that carries text: the
    /// first one ends the request's server-side TTFT (a debug event).
    pub fn note_text_event(&mut self) {
        self.clock.event(&self.request_id);
    }

    fn on_tokens(&mut self, ids: &[u32]) {
        self.clock.tokens(&self.request_id);
        let now = Instant::now();
        match self.last_token_at {
            None => self.state.metrics.observe_ttft(now - self.started),
            Some(prev) => self.state.metrics.observe_inter_token(now - prev),
        }
        self.last_token_at = Some(now);
        // One token at a time: a speculative step delivers several at once,
        // and a stop string inside them must end the text and the usage
        // exactly where one-token steps would have.
        for &id in ids {
            self.completion_tokens += 1;
            self.queue_logprobs(id);
            let text = match self.detok.push_all(&[id]) {
                Ok(t) => t,
                Err(e) => return self.end(String::new(), Step::Failed(format!("{e:#}"))),
            };
            self.decoded_chars += text.chars().count();
            let d = self.stop.push(&text);
            if let Some(i) = d.stopped {
                self.matched_stop = self.stop.stop_string(i).map(str::to_string);
                // A stop string matched: the engine ends the request as a
                // `stop` finish (dropping the stream would count an abort).
                if let Some(stream) = self.stream.take() {
                    stream.finish_on_stop_string();
                }
                let usage = Usage::new(
                    self.prompt_tokens as u32,
                    self.completion_tokens as u32,
                    None,
                );
                return self.end(
                    d.text,
                    Step::Finished {
                        reason: FinishReason::Stop,
                        usage,
                    },
                );
            }
            if !d.text.is_empty() {
                self.queue.push_back(Step::Text(d.text));
            }
        }
    }

    /// Queues the logprobs of token `id`, which the engine sent before it.
    fn queue_logprobs(&mut self, id: u32) {
        let Some(tokenizer) = &self.logprobs_tokenizer else {
            return;
        };
        match self.pending_logprobs.pop_front() {
            Some(lp) if lp.token == id => {
                let g = crate::logprobs::generated(tokenizer, &lp, self.decoded_chars);
                self.queue.push_back(Step::Logprobs(vec![g]));
            }
            _ => tracing::warn!(request_id = %self.request_id, "a token came without its logprobs"),
        }
    }

    /// Queues the last text and the final step, drops the engine stream and
    /// records the outcome.
    fn end(&mut self, text: String, last: Step) {
        self.stream = None;
        if !text.is_empty() {
            self.queue.push_back(Step::Text(text));
        }
        let label = match &last {
            Step::Finished { reason, .. } => match reason {
                FinishReason::Length => "length",
                FinishReason::Abort => "abort",
                FinishReason::Error => "error",
                FinishReason::Stop | FinishReason::ToolCalls => "stop",
            },
            _ => "error",
        };
        if let Step::Failed(msg) = &last {
            tracing::warn!(request_id = %self.request_id, "generation failed: {msg}");
        }
        self.record(label);
        self.queue.push_back(last);
    }

    fn record(&mut self, label: &str) {
        if !self.recorded {
            self.recorded = true;
            self.state
                .metrics
                .observe_finished(label, self.started.elapsed());
        }
    }
}

impl Drop for TextGeneration {
    fn drop(&mut self) {
        if !self.recorded {
            // The client went away before the end; the stream's drop aborts.
            tracing::info!(
                request_id = %self.request_id,
                completion_tokens = self.completion_tokens,
                "client disconnected; request aborted"
            );
            self.record("abort");
        }
    }
}

fn engine_reason(r: kestrel_sampling::FinishReason) -> FinishReason {
    match r {
        kestrel_sampling::FinishReason::Stop => FinishReason::Stop,
        kestrel_sampling::FinishReason::Length => FinishReason::Length,
        kestrel_sampling::FinishReason::Abort => FinishReason::Abort,
    }
}

/// The error a failed generation is answered with. A constraint that fails
/// while generating (the engine's message starts with "the output
/// constraint failed": typically a grammar past llguidance's parser limits,
/// such as thousands of choices sharing a prefix) is the request's grammar
/// at fault, a 400; anything else is the server's, a 500.
fn failure(msg: String) -> ServerError {
    if msg.starts_with("the output constraint failed") {
        return ApiError::invalid("response_format", msg).into();
    }
    ServerError::internal(msg)
}
