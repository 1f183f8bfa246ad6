//! The per-request sampling parameters and their validation.
//!
//! Ranges follow the OpenAI API and vLLM's `SamplingParams._verify_args`; the
//! HTTP layer turns an [`InvalidParam`] into a 400 naming `param`.

/// How one sequence chooses its tokens and when it stops.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature in `[0, 2]`; 0 means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 or -1 turns the filter off.
    pub top_k: i32,
    /// Keep the smallest set of most likely tokens whose mass reaches `top_p`, in `(0, 1]`.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top token's, in `[0, 1]`.
    pub min_p: f32,
    /// Divides positive / multiplies negative logits of every token seen in
    /// the prompt or the output; 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token the output already contains, in `[-2, 2]`.
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output, in `[-2, 2]`.
    pub frequency_penalty: f32,
    /// RNG seed; `None` seeds from the operating system.
    pub seed: Option<u64>,
    /// Extra token ids that end generation (besides the model's EOS ids).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past the model's EOS ids.
    pub ignore_eos: bool,
    /// Most tokens to generate; `None` leaves the limit to the context length.
    pub max_tokens: Option<usize>,
    /// Stop tokens and EOS are suppressed until this many tokens were generated.
    pub min_tokens: usize,
    /// Report each generated token's log-probability and this many of the
    /// row's most likely ids (at most [`crate::MAX_TOP_LOGPROBS`]); `None`
    /// reports nothing.
    pub logprobs: Option<usize>,
    /// Report, for every prompt token after the first, its log-probability
    /// given the tokens before it and this many of that row's most likely
    /// ids (at most [`crate::MAX_TOP_LOGPROBS`]); `None` reports nothing.
    pub prompt_logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            max_tokens: None,
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
        }
    }
}

/// A parameter outside its allowed range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{param} {message}")]
pub struct InvalidParam {
    /// The request field at fault, as the OpenAI API names it.
    pub param: &'static str,
    pub message: String,
}

impl InvalidParam {
    fn new(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param,
            message: message.into(),
        }
    }
}

/// A finite value inside `[lo, hi]`, where `lo_open` excludes `lo`.
fn check_range(
    param: &'static str,
    value: f32,
    lo: f32,
    lo_open: bool,
    hi: f32,
) -> Result<(), InvalidParam> {
    if !value.is_finite() {
        return Err(InvalidParam::new(
            param,
            format!("must be a finite number, got {value}"),
        ));
    }
    let above_lo = if lo_open { value > lo } else { value >= lo };
    if !above_lo || value > hi {
        let open = if lo_open { '(' } else { '[' };
        return Err(InvalidParam::new(
            param,
            format!("must be in {open}{lo}, {hi}], got {value}"),
        ));
    }
    Ok(())
}

impl SamplingParams {
    /// Parameters for greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Check every range; the first violation names its parameter.
    pub fn validate(&self) -> Result<(), InvalidParam> {
        check_range("temperature", self.temperature, 0.0, false, 2.0)?;
        check_range("top_p", self.top_p, 0.0, true, 1.0)?;
        if self.top_k < -1 {
            return Err(InvalidParam::new(
                "top_k",
                format!(
                    "must be 0 or -1 (disabled) or at least 1, got {}",
                    self.top_k
                ),
            ));
        }
        check_range("min_p", self.min_p, 0.0, false, 1.0)?;
        check_range("presence_penalty", self.presence_penalty, -2.0, false, 2.0)?;
        check_range(
            "frequency_penalty",
            self.frequency_penalty,
            -2.0,
            false,
            2.0,
        )?;
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return Err(InvalidParam::new(
                "repetition_penalty",
                format!(
                    "must be a finite number greater than 0, got {}",
                    self.repetition_penalty
                ),
            ));
        }
        if let Some(top) = self.logprobs
            && top > crate::MAX_TOP_LOGPROBS
        {
            return Err(InvalidParam::new(
                "logprobs",
                format!("must be at most {}, got {top}", crate::MAX_TOP_LOGPROBS),
            ));
        }
        if let Some(top) = self.prompt_logprobs
            && top > crate::MAX_TOP_LOGPROBS
        {
            return Err(InvalidParam::new(
                "prompt_logprobs",
                format!("must be at most {}, got {top}", crate::MAX_TOP_LOGPROBS),
            ));
        }
        // `max_tokens: 0` computes the prompt (and its logprobs) and
        // generates nothing.
        if let Some(max_tokens) = self.max_tokens
            && self.min_tokens > max_tokens
        {
            return Err(InvalidParam::new(
                "min_tokens",
                format!(
                    "must be less than or equal to max_tokens={max_tokens}, got {}",
                    self.min_tokens
                ),
            ));
        }
        Ok(())
    }

    /// Whether this request decodes greedily. vLLM treats temperatures below
    /// 1e-5 as 0, so tiny values do not blow the logits up.
    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    /// The top-k filter size, `None` when the filter is off.
    pub fn top_k_limit(&self) -> Option<usize> {
        (self.top_k >= 1).then_some(self.top_k as usize)
    }
}

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub(crate) const GREEDY_TEMPERATURE: f32 = 1e-5;
