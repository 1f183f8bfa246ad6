//! Structured outputs: a request's JSON schema, regex, choice list, Lark
//! grammar or forced tool call, compiled by llguidance into a per-sequence
//! [`kestrel_engine::TokenConstraint`] that masks each sampled row.
//!
//! * [`vocabulary`]: the token bytes llguidance matches against, read from
//!   the model's `tokenizer.json`.
//! * [`grammar`]: a request's constraint as an llguidance grammar; for
//!   generation that starts inside reasoning the grammar lets the reasoning
//!   run free and applies only after `</think>`.
//! * `xml_call`, `xml_value`, `xml_json`: forced tool calls in the XML
//!   format, each parameter value constrained so that the XML tool parser
//!   converts it back into a value its schema accepts.
//! * [`compiler`]: builds the tokenizer-wide state once (lazily, on the
//!   first constrained request) and compiles grammars; a grammar that does
//!   not compile is the request's error, nothing else's.
//! * [`matcher`]: the engine-facing matcher. Masks are computed on the host,
//!   one row at a time, on the engine thread; computing them on the CPU
//!   while the GPU runs the step, and applying them on the device, are
//!   later steps.

pub mod compiler;
pub mod grammar;
mod layout;
pub mod matcher;
pub mod vocabulary;
mod xml_call;
mod xml_json;
mod xml_value;

pub use compiler::{CompileError, GrammarCompiler};
pub use grammar::{OutputGrammar, ToolCallFormat};
