//! The Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`)
//! as a translation layer over the chat pipeline: a Messages body becomes
//! the equivalent chat body ([`request`]), which the chat validation,
//! template and output parsers handle as usual; the parsed output becomes
//! content blocks ([`response`]) or Anthropic's stream events ([`stream`]).

mod convert;
pub mod request;
pub mod response;
pub mod stream;

pub use request::{
    MessagesRequest, Normalization, check_context, parse_messages_body, strip_billing_header,
};
pub use response::{MessageResponse, MessageUsage, content_blocks, error_body, stop_reason};
pub use stream::MessageStream;

#[cfg(test)]
mod tests;
