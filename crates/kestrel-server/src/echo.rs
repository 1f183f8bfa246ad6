//! What a text completion reports about its prompt: `echo` (the prompt's
//! text before the completion and, with `logprobs`, its tokens' logprobs
//! before the completion's) and vLLM's `prompt_logprobs`. Every choice of a
//! request reports the same; the first choice's engine request computes the
//! prompt logprobs once for all of them.

use kestrel_api::types::{CompletionLogprobs, PromptLogprobs};
use kestrel_api::{CompletionRequest, Prompt};

use crate::error::{ServerError, ServerResult};
use crate::generation::TextGeneration;
use crate::prompt_logprobs::{EchoRequest, echo_logprobs, prompt_logprobs_field};
use crate::state::LoadedModel;

/// The alternatives per prompt position the engine must compute: those of
/// `prompt_logprobs`, and with `echo` those of `logprobs` (the echoed
/// tokens get their alternatives from the prompt's rows).
pub fn prompt_logprobs_to_compute(req: &CompletionRequest) -> Option<usize> {
    let echoed = req.echo.then_some(req.sampling.logprobs).flatten();
    [echoed, req.sampling.prompt_logprobs]
        .into_iter()
        .flatten()
        .max()
        .map(|n| n as usize)
}

/// The prompt's part of every choice.
#[derive(Clone, Debug, Default)]
pub struct PromptReport {
    /// `echo`: the prompt's text and, with `logprobs`, its tokens' logprobs.
    pub echo: Option<(String, Option<CompletionLogprobs>)>,
    /// `prompt_logprobs`, when asked for.
    pub prompt_logprobs: Option<PromptLogprobs>,
}

impl PromptReport {
    /// The report of `req`'s prompt `prompt_ids`. When prompt logprobs are
    /// needed this waits until `first` (the first choice) has computed the
    /// prompt: the engine sends them before any token. `truncated`: the
    /// prompt lost tokens to `truncate_prompt_tokens` (its text is then the
    /// kept tokens' text, not the request's).
    pub async fn build(
        model: &LoadedModel,
        req: &CompletionRequest,
        prompt_ids: &[u32],
        truncated: bool,
        first: &mut TextGeneration,
    ) -> ServerResult<Self> {
        let entries = if prompt_logprobs_to_compute(req).is_some() {
            first.prefilled().await;
            first.take_prompt_logprobs()
        } else {
            Vec::new()
        };
        let report_on = EchoRequest {
            tokenizer: &model.tokenizer,
            first_token: prompt_ids.first().copied().unwrap_or_default(),
            entries: &entries,
        };
        let echo = if req.echo {
            let text = match &req.prompt {
                Prompt::Text(text) if !truncated => text.clone(),
                _ => model
                    .tokenizer
                    .decode(prompt_ids, false)
                    .map_err(|e| ServerError::internal(format!("{e:#}")))?,
            };
            let logprobs = req
                .sampling
                .logprobs
                .map(|top| echo_logprobs(&report_on, top as usize));
            Some((text, logprobs))
        } else {
            None
        };
        let prompt_logprobs = req
            .sampling
            .prompt_logprobs
            .map(|top| prompt_logprobs_field(&model.tokenizer, &entries, top as usize));
        Ok(PromptReport {
            echo,
            prompt_logprobs,
        })
    }

    /// A finished choice's text and logprobs with the echo before them.
    pub fn prepend(
        &self,
        text: String,
        logprobs: Option<CompletionLogprobs>,
    ) -> (String, Option<CompletionLogprobs>) {
        let Some((echoed, echoed_logprobs)) = &self.echo else {
            return (text, logprobs);
        };
        let chars = u32::try_from(echoed.chars().count()).unwrap_or(u32::MAX);
        let logprobs = logprobs.map(|generated| {
            let mut all = echoed_logprobs.clone().unwrap_or_default();
            all.append(generated.shifted(chars));
            all
        });
        (format!("{echoed}{text}"), logprobs)
    }
}
