//! Several choices (`n > 1`) of one prompt: each is its own engine request
//! with its own seed stream (`seed + i` when the request gives a seed). The
//! first is submitted alone and the others once it has computed the prompt,
//! so that they find its pages in the prefix cache instead of computing the
//! same prompt side by side.

use std::sync::Arc;
use std::time::Instant;

use kestrel_api::GenerationParams;
use kestrel_engine::Constraint;
use kestrel_sampling::SamplingParams;

use crate::error::ServerResult;
use crate::generation::{Collected, TextGeneration};
use crate::state::{AppState, LoadedModel};

/// Submits `n` choices; their generations, choice `i` at `i`. Failing to
/// submit one drops (aborts) the ones already submitted.
#[allow(clippy::too_many_arguments)]
pub async fn submit_choices(
    state: &Arc<AppState>,
    model: &LoadedModel,
    request_id: &str,
    prompt_ids: Vec<u32>,
    params: SamplingParams,
    generation_params: &GenerationParams,
    received: Instant,
    constraint: Option<Constraint>,
    n: u32,
) -> ServerResult<Vec<TextGeneration>> {
    let submit = |i: u32, prompt_ids: Vec<u32>, constraint: Option<Constraint>| {
        let mut params = params.clone();
        params.seed = params.seed.map(|s| s.wrapping_add(u64::from(i)));
        if i > 0 {
            // The choices share one prompt: its logprobs come from the first.
            params.prompt_logprobs = None;
        }
        let id = if n == 1 {
            request_id.to_string()
        } else {
            format!("{request_id}-{i}")
        };
        TextGeneration::submit(
            state,
            model,
            id,
            prompt_ids,
            params,
            generation_params,
            received,
            constraint,
        )
    };
    if n <= 1 {
        return Ok(vec![submit(0, prompt_ids, constraint)?]);
    }
    let mut first = submit(0, prompt_ids.clone(), constraint.clone())?;
    first.prefilled().await;
    let mut all = vec![first];
    for i in 1..n {
        all.push(submit(i, prompt_ids.clone(), constraint.clone())?);
    }
    Ok(all)
}

/// Every choice run to its end, and their usage as one request's (the
/// prompt once, every choice's completion tokens).
pub async fn collect_choices(
    generations: Vec<TextGeneration>,
) -> ServerResult<(Vec<Collected>, kestrel_api::types::Usage)> {
    let collected = futures_util::future::try_join_all(
        generations
            .into_iter()
            .map(|g| g.collect_all(String::new())),
    )
    .await?;
    let usage = kestrel_api::types::Usage::of_choices(
        &collected.iter().map(|c| c.usage).collect::<Vec<_>>(),
    );
    Ok((collected, usage))
}
