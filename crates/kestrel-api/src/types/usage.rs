use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: Option<u32>) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: cached_tokens
                .map(|cached_tokens| PromptTokensDetails { cached_tokens }),
        }
    }
}

impl Usage {
    /// The usage of several choices of one prompt, as OpenAI counts it: the
    /// prompt once, the completion tokens of every choice. The cached
    /// prompt tokens are the fewest any choice reported.
    pub fn of_choices(choices: &[Usage]) -> Usage {
        let prompt = choices.first().map_or(0, |u| u.prompt_tokens);
        let completion = choices
            .iter()
            .fold(0u32, |sum, u| sum.saturating_add(u.completion_tokens));
        let cached = choices
            .iter()
            .filter_map(|u| u.prompt_tokens_details)
            .map(|d| d.cached_tokens)
            .min();
        Usage::new(prompt, completion, cached)
    }
}
