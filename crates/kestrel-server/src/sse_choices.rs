//! The stream of a request with several choices (`n > 1`): each choice's
//! generation runs on its own, their chunks interleave as they come (each
//! names its `index`), and the stream closes once, after the last choice,
//! with one usage chunk for them all (see [`Usage::of_choices`]).

use std::pin::Pin;
use std::time::Duration;

use axum::response::Response;
use futures_util::stream::{self, SelectAll, Stream, StreamExt};
use kestrel_api::types::Usage;
use kestrel_api::types::sse::SSE_PING;

use crate::generation::{Step, TextGeneration};
use crate::sse::{ChoiceAssembler, SseAssembler, event_stream, sse_response};

/// Steps of one choice, tagged with its index.
type ChoiceSteps = Pin<Box<dyn Stream<Item = (usize, Step)> + Send>>;

struct Choices<A> {
    steps: SelectAll<ChoiceSteps>,
    assemblers: Vec<A>,
    /// Each choice's usage once it finished.
    usage: Vec<Option<Usage>>,
    pending: std::collections::VecDeque<String>,
    done: bool,
    ping: Duration,
}

impl<A: ChoiceAssembler> Choices<A> {
    async fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            // The select keeps each choice's pending receive inside it, so
            // a ping never loses a step.
            let next = match tokio::time::timeout(self.ping, self.steps.next()).await {
                Err(_) => return Some(SSE_PING.to_string()),
                Ok(next) => next,
            };
            match next {
                Some((i, step)) => self.on_step(i, step),
                None => {
                    // Every choice ended; one that ended without a final step
                    // counts as finished with nothing more.
                    let usage: Vec<Usage> = self.usage.iter().flatten().copied().collect();
                    let first = self.assemblers.first_mut();
                    if let Some(a) = first {
                        self.pending.extend(a.close(Usage::of_choices(&usage)));
                    }
                    self.done = true;
                }
            }
        }
    }

    fn on_step(&mut self, i: usize, step: Step) {
        let assembler = &mut self.assemblers[i];
        match step {
            Step::Text(t) => self.pending.extend(assembler.text(&t)),
            Step::Logprobs(tokens) => assembler.logprobs(&tokens),
            Step::Finished { reason, usage } => {
                self.pending.extend(assembler.finish_choice(reason));
                self.usage[i] = Some(usage);
            }
            Step::Failed(msg) => {
                // One failed choice fails the stream; dropping the others
                // aborts them.
                self.pending.extend(assembler.failure(&msg));
                self.steps = SelectAll::new();
                self.done = true;
            }
        }
    }
}

/// The streaming response of a request's choices, choice `i` assembled by
/// `assembler(i)`: one choice streams as any single generation does, more
/// interleave ([`choices_response`]).
pub fn stream_choices<A: SseAssembler + ChoiceAssembler>(
    mut generations: Vec<TextGeneration>,
    assembler: impl Fn(u32) -> A,
    ping: Duration,
) -> Response {
    if generations.len() == 1 {
        return sse_response(generations.remove(0), assembler(0), ping);
    }
    let assemblers = (0..generations.len() as u32).map(assembler).collect();
    choices_response(generations, assemblers, ping)
}

/// The streaming response of several generations of one prompt, choice `i`
/// built by `assemblers[i]`.
pub fn choices_response<A: ChoiceAssembler>(
    generations: Vec<TextGeneration>,
    mut assemblers: Vec<A>,
    ping: Duration,
) -> Response {
    let mut pending = std::collections::VecDeque::new();
    for a in &mut assemblers {
        pending.extend(a.start());
    }
    let steps = stream::select_all(generations.into_iter().enumerate().map(|(i, g)| {
        let steps = stream::unfold(g, move |mut g| async move {
            let step = g.next().await?;
            Some(((i, step), g))
        });
        Box::pin(steps) as ChoiceSteps
    }));
    let choices = Choices {
        steps,
        usage: vec![None; assemblers.len()],
        assemblers,
        pending,
        done: false,
        ping,
    };
    event_stream(stream::unfold(choices, |mut c| async move {
        let event = c.next_event().await?;
        Some((event, c))
    }))
}
