//! HTTP handlers, one file per route group.

pub mod chat;
pub mod completions;
pub mod health;
pub mod messages;
pub mod metrics;
pub mod models;
pub mod prompt;
pub mod tokenize;

use kestrel_api::ValidationOptions;

/// What this server implements; requests for anything else get a 400.
pub fn validation_options() -> ValidationOptions {
    ValidationOptions {
        // Enforced by starting the reply with the call (routes/chat.rs).
        forced_tool_choice_supported: true,
        ..ValidationOptions::default()
    }
}
