//! Server-sent-event assembly. An assembler turns generated text into the
//! event strings of one stream (chat or text completion); [`sse_response`]
//! drives a [`TextGeneration`] through it, with `: ping` keep-alives while no
//! tokens arrive. Dropping the response body (client gone) drops the
//! generation and so aborts the request. Streams of several choices are in
//! [`crate::sse_choices`].

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use kestrel_api::output::{ChatOutputParser, OutputOptions};
use kestrel_api::types::sse::{
    ChatStream, CompletionStream, SSE_DONE, SSE_PING, sse_error, sse_event,
};
use kestrel_api::types::{FinishReason, GeneratedLogprob, Usage};
use kestrel_api::{ApiError, ErrorKind};

use crate::generation::{Step, TextGeneration};

/// The events of one stream, given its text.
pub trait SseAssembler: Send + 'static {
    /// Events sent before any token (the chat role chunk).
    fn start(&mut self) -> Vec<String>;
    /// Events for a piece of generated text (possibly none).
    fn text(&mut self, text: &str) -> Vec<String>;
    /// Logprobs of generated tokens, sent with the next events (streams
    /// that report none ignore them).
    fn logprobs(&mut self, _tokens: &[GeneratedLogprob]) {}
    /// The closing events, ending with `data: [DONE]`.
    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<String>;
    /// [`Self::finish`] when the stop string that ended the text matters
    /// (Anthropic's `stop_sequence`).
    fn finish_at_stop(
        &mut self,
        reason: FinishReason,
        usage: Usage,
        _stop_sequence: Option<&str>,
    ) -> Vec<String> {
        self.finish(reason, usage)
    }
    /// The events of a mid-stream failure.
    fn failure(&mut self, message: &str) -> Vec<String> {
        error_events(message)
    }
}

/// One choice of an OpenAI stream, which may carry several (`n > 1`): its
/// own chunks, and the stream's closing events apart.
pub trait ChoiceAssembler: SseAssembler {
    /// The events that end this choice (its last chunk, with `finish_reason`).
    fn finish_choice(&mut self, reason: FinishReason) -> Vec<String>;
    /// The events that end the stream: the usage chunk when asked for, then
    /// `data: [DONE]`.
    fn close(&mut self, usage: Usage) -> Vec<String>;
}

/// A mid-stream failure: one error event, then `[DONE]`.
pub fn error_events(message: &str) -> Vec<String> {
    let e = ApiError::new(ErrorKind::Internal, message);
    vec![sse_error(&e), SSE_DONE.to_string()]
}

pub struct ChatSse {
    stream: ChatStream,
    parser: ChatOutputParser,
    include_usage: bool,
    /// Text the server wrote at the start of the reply (a forced tool call's
    /// opening), parsed as if the model had generated it.
    reply_prefix: String,
}

impl ChatSse {
    /// The stream of choice `index` (0 unless `n > 1`).
    pub fn new(
        id: String,
        model: String,
        created: u64,
        index: u32,
        opts: &OutputOptions,
        include_usage: bool,
    ) -> Self {
        ChatSse {
            stream: ChatStream::new(id, model, created).with_index(index),
            parser: ChatOutputParser::new(opts),
            include_usage,
            reply_prefix: String::new(),
        }
    }

    /// vLLM's `prompt_logprobs`, sent on the stream's first chunk.
    pub fn with_prompt_logprobs(
        mut self,
        prompt_logprobs: Option<kestrel_api::types::PromptLogprobs>,
    ) -> Self {
        self.stream = self.stream.with_prompt_logprobs(prompt_logprobs);
        self
    }

    pub fn with_reply_prefix(mut self, prefix: &str) -> Self {
        self.reply_prefix = prefix.to_string();
        self
    }
}

impl SseAssembler for ChatSse {
    fn start(&mut self) -> Vec<String> {
        let mut events = vec![sse_event(&self.stream.start())];
        let prefix = std::mem::take(&mut self.reply_prefix);
        events.extend(self.text(&prefix));
        events
    }

    fn text(&mut self, text: &str) -> Vec<String> {
        let parts = self.parser.push(text);
        self.stream
            .delta(parts)
            .map(|c| sse_event(&c))
            .into_iter()
            .collect()
    }

    fn logprobs(&mut self, tokens: &[GeneratedLogprob]) {
        self.stream.push_logprobs(tokens);
    }

    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<String> {
        let mut out = self.finish_choice(reason);
        out.extend(self.close(usage));
        out
    }
}

impl ChoiceAssembler for ChatSse {
    fn finish_choice(&mut self, reason: FinishReason) -> Vec<String> {
        let end = self.parser.finish();
        let reason = self.parser.finish_reason(reason, &end);
        let mut out: Vec<String> = self
            .stream
            .delta(end.parts)
            .map(|c| sse_event(&c))
            .into_iter()
            .collect();
        out.push(sse_event(&self.stream.finish(reason)));
        out
    }

    fn close(&mut self, usage: Usage) -> Vec<String> {
        let mut out = Vec::new();
        if self.include_usage {
            out.push(sse_event(&self.stream.usage(usage)));
        }
        out.push(SSE_DONE.to_string());
        out
    }
}

pub struct CompletionSse {
    stream: CompletionStream,
    include_usage: bool,
}

impl CompletionSse {
    /// The stream of choice `index` (0 unless `n > 1`).
    pub fn new(id: String, model: String, created: u64, index: u32, include_usage: bool) -> Self {
        CompletionSse {
            stream: CompletionStream::new(id, model, created).with_index(index),
            include_usage,
        }
    }

    /// The choice opens with what `report` says about the prompt (its echo,
    /// its logprobs).
    pub(crate) fn with_prompt_report(mut self, report: &crate::echo::PromptReport) -> Self {
        let mut stream = self
            .stream
            .with_prompt_logprobs(report.prompt_logprobs.clone());
        if let Some((text, logprobs)) = &report.echo {
            stream = stream.with_echo(text.clone(), logprobs.clone());
        }
        self.stream = stream;
        self
    }
}

impl SseAssembler for CompletionSse {
    fn start(&mut self) -> Vec<String> {
        self.stream
            .start()
            .map(|c| sse_event(&c))
            .into_iter()
            .collect()
    }

    fn text(&mut self, text: &str) -> Vec<String> {
        self.stream
            .delta(text.to_string())
            .map(|c| sse_event(&c))
            .into_iter()
            .collect()
    }

    fn logprobs(&mut self, tokens: &[GeneratedLogprob]) {
        self.stream.push_logprobs(tokens);
    }

    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<String> {
        let mut out = self.finish_choice(reason);
        out.extend(self.close(usage));
        out
    }
}

impl ChoiceAssembler for CompletionSse {
    fn finish_choice(&mut self, reason: FinishReason) -> Vec<String> {
        vec![sse_event(&self.stream.finish(reason))]
    }

    fn close(&mut self, usage: Usage) -> Vec<String> {
        let mut out = Vec::new();
        if self.include_usage {
            out.push(sse_event(&self.stream.usage(usage)));
        }
        out.push(SSE_DONE.to_string());
        out
    }
}

struct Driver<A> {
    generation: TextGeneration,
    assembler: A,
    pending: VecDeque<String>,
    done: bool,
    ping: Duration,
}

impl<A: SseAssembler> Driver<A> {
    /// The next bytes to send, or `None` when the stream is over.
    async fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            // `next` is cancel-safe, so a ping never loses a token.
            let step = match tokio::time::timeout(self.ping, self.generation.next()).await {
                Err(_) => return Some(SSE_PING.to_string()),
                Ok(step) => step,
            };
            match step {
                Some(Step::Text(t)) => {
                    let events = self.assembler.text(&t);
                    if !events.is_empty() {
                        self.generation.note_text_event();
                    }
                    self.pending.extend(events);
                }
                Some(Step::Logprobs(tokens)) => self.assembler.logprobs(&tokens),
                Some(Step::Finished { reason, usage }) => {
                    let stop = self.generation.stop_sequence();
                    let events = self.assembler.finish_at_stop(reason, usage, stop);
                    self.pending.extend(events);
                    self.done = true;
                }
                Some(Step::Failed(msg)) => {
                    self.pending.extend(self.assembler.failure(&msg));
                    self.done = true;
                }
                None => self.done = true,
            }
        }
    }
}

/// The streaming HTTP response for a submitted generation.
pub fn sse_response<A: SseAssembler>(
    generation: TextGeneration,
    mut assembler: A,
    ping: Duration,
) -> Response {
    let pending = assembler.start().into();
    let driver = Driver {
        generation,
        assembler,
        pending,
        done: false,
        ping,
    };
    event_stream(futures_util::stream::unfold(driver, |mut d| async move {
        let event = d.next_event().await?;
        Some((event, d))
    }))
}

/// A `text/event-stream` response sending `events`.
pub(crate) fn event_stream(
    events: impl futures_util::Stream<Item = String> + Send + 'static,
) -> Response {
    use futures_util::StreamExt;
    let body = events.map(|event| Ok::<_, Infallible>(Bytes::from(event)));
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}
