//! HTTP handlers, one file per route group.

pub mod chat;
pub mod completions;
pub mod health;
pub mod messages;
pub mod metrics;
pub mod models;
pub mod prompt;
pub mod responses;
pub mod tokenize;

use kestrel_api::ValidationOptions;

/// Most choices (`n`) one request may ask for; each is its own engine request.
pub const MAX_CHOICES: u32 = 16;

/// What this server implements; requests for anything else get a 400.
pub fn validation_options() -> ValidationOptions {
    ValidationOptions {
        max_n: MAX_CHOICES,
        logprobs_supported: true,
        // Both enforced by a grammar (src/structured.rs).
        forced_tool_choice_supported: true,
        structured_outputs_supported: true,
        ..ValidationOptions::default()
    }
}
