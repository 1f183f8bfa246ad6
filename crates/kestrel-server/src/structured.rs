//! Structured outputs and forced tool calls as engine constraints: which
//! grammar a request asks for, compiled off the async workers (a large
//! schema may take a while, and must not hold up other requests), with a
//! grammar that does not compile answered 400 with llguidance's reason.

use std::sync::Arc;

use kestrel_api::{ApiError, StructuredOutput, Tool, ToolChoice};
use kestrel_engine::Constraint;
use kestrel_structured::grammar::GrammarStart;
use kestrel_structured::{CompileError, OutputGrammar};

use crate::error::{ServerError, ServerResult};
use crate::state::LoadedModel;

/// What a request constrains its output to, owned so it can move to a
/// blocking task.
pub enum ConstraintRequest {
    Structured(StructuredOutput),
    ToolCall { tools: Vec<Tool>, parallel: bool },
}

impl ConstraintRequest {
    /// A chat request's constraint: the forced tool call of `tool_choice`
    /// `required` (any declared tool) or named (that tool), else its
    /// structured output. Both at once is a 400.
    pub fn for_chat(
        structured: Option<&StructuredOutput>,
        tools: &[Tool],
        choice: &ToolChoice,
        parallel_tool_calls: bool,
    ) -> ServerResult<Option<Self>> {
        let forced = match choice {
            ToolChoice::Required => Some(ConstraintRequest::ToolCall {
                tools: tools.to_vec(),
                parallel: parallel_tool_calls,
            }),
            ToolChoice::Named(name) => Some(ConstraintRequest::ToolCall {
                tools: tools.iter().filter(|t| &t.name == name).cloned().collect(),
                parallel: false,
            }),
            ToolChoice::Auto | ToolChoice::None => None,
        };
        match (forced, structured) {
            (Some(_), Some(_)) => Err(ApiError::invalid(
                "response_format",
                "a structured output cannot be combined with a forced tool_choice",
            )
            .into()),
            (Some(call), None) => Ok(Some(call)),
            (None, s) => Ok(s.cloned().map(ConstraintRequest::Structured)),
        }
    }

    /// The parameter a compile error is reported against.
    fn param(&self) -> &'static str {
        match self {
            ConstraintRequest::Structured(_) => "response_format",
            ConstraintRequest::ToolCall { .. } => "tools",
        }
    }
}

/// llguidance's Lark compiler recurses once per rule a rule refers to, so a
/// long chain of rules needs a deep stack (about 3000 rules overflow the
/// 2 MiB of a blocking-pool thread and abort the process). Compiles run on
/// a thread of their own with this much stack, reserved and touched only
/// as used.
const COMPILE_STACK_BYTES: usize = 256 << 20;

/// The longest Lark grammar accepted: it bounds the rule chain, and so the
/// stack the compile needs, well inside [`COMPILE_STACK_BYTES`].
pub const MAX_GRAMMAR_BYTES: usize = 128 << 10;

/// Compiles `request` for `model` on a thread of its own. `starts_in_reasoning`:
/// the prompt leaves a `<think>` open, so the constraint starts after
/// `</think>`.
pub async fn compile(
    model: &Arc<LoadedModel>,
    request: ConstraintRequest,
    starts_in_reasoning: bool,
) -> ServerResult<Constraint> {
    if let ConstraintRequest::Structured(StructuredOutput::Lark(grammar)) = &request
        && grammar.len() > MAX_GRAMMAR_BYTES
    {
        return Err(ApiError::invalid(
            request.param(),
            format!(
                "the grammar is {} bytes; at most {MAX_GRAMMAR_BYTES} are accepted",
                grammar.len()
            ),
        )
        .into());
    }
    let start = GrammarStart {
        reasoning_end: starts_in_reasoning
            .then(|| model.tokenizer.token_id("</think>"))
            .flatten(),
    };
    let model = model.clone();
    let (done, compiled) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("grammar-compile".into())
        .stack_size(COMPILE_STACK_BYTES)
        .spawn(move || {
            // The receiver is gone only if the client left.
            let _ = done.send(compile_now(&model, &request, start));
        })
        .map_err(|e| ServerError::internal(format!("cannot start the grammar compile: {e}")))?;
    compiled
        .await
        .map_err(|_| ServerError::internal("grammar compilation failed"))?
}

fn compile_now(
    model: &LoadedModel,
    request: &ConstraintRequest,
    start: GrammarStart,
) -> ServerResult<Constraint> {
    let grammar = match request {
        ConstraintRequest::Structured(s) => OutputGrammar::Structured(s),
        ConstraintRequest::ToolCall { tools, parallel } => OutputGrammar::ToolCall {
            tools,
            parallel: *parallel,
            format: model.tool_call_format,
        },
    };
    model
        .grammars
        .compile(&grammar, start)
        .map_err(|e| match e {
            CompileError::Invalid(reason) => ServerError::from(ApiError::invalid(
                request.param(),
                format!("the output constraint does not compile: {reason}"),
            )),
            CompileError::Unavailable(_) => ServerError::from(
                ApiError::unsupported("structured outputs for this model")
                    .with_param(request.param()),
            ),
        })
}
