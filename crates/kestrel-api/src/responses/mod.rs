//! The OpenAI Responses API (`/v1/responses`) as a translation layer over
//! the chat pipeline, like [`crate::anthropic`]: a Responses body becomes the
//! equivalent chat body ([`request`], [`input`]), which the chat validation,
//! template and output parsers handle as usual; the parsed output becomes
//! output items and the Responses stream events ([`stream`]).

mod fields;
mod input;
pub mod request;
pub mod response;
pub mod stream;

pub use request::{ResponsesRequest, in_responses_terms, parse_responses_body};
pub use response::ResponseUsage;
pub use stream::ResponseBuilder;

#[cfg(test)]
mod tests;
