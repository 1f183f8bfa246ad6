//! The engine: admits requests, schedules forward passes and keeps each
//! sequence's cache state.

pub mod cache;
