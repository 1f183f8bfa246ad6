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

/// What this server implements; requests for anything else get a 400.
pub fn validation_options() -> ValidationOptions {
    ValidationOptions {
        // Both enforced by a grammar (src/structured.rs).
        forced_tool_choice_supported: true,
        structured_outputs_supported: true,
        ..ValidationOptions::default()
    }
}
