//! `POST /tokenize` and `POST /detokenize` bodies (vLLM and llama-server
//! field names).

use serde_json::Value;

use super::fields::{Result, type_name};
use super::messages::parse_messages;
use super::sampling::token_id;
use super::tools::parse_tools;
use super::{ValidationOptions, root};
use crate::error::ApiError;
use crate::request::{ChatMessage, Tool};

#[derive(Debug, Clone, PartialEq)]
pub enum TokenizeInput {
    /// `prompt` (vLLM) or `content` (llama-server).
    Text(String),
    /// `messages`, rendered through the chat template first.
    Chat {
        messages: Vec<ChatMessage>,
        tools: Vec<Tool>,
        add_generation_prompt: bool,
        chat_template_kwargs: serde_json::Map<String, Value>,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub input: TokenizeInput,
    /// `None`: the endpoint default (true for text, false for chat, as vLLM).
    pub add_special_tokens: Option<bool>,
    pub return_token_strs: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

pub fn parse_tokenize_request(body: &Value, opts: &ValidationOptions) -> Result<TokenizeRequest> {
    let mut f = root(body)?;
    let model = f.string("model")?.map(str::to_string);
    let prompt = f.string("prompt")?;
    let content = f.string("content")?;
    let messages = f.get("messages");
    let input = match (prompt.or(content), messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "messages",
                "give either prompt or messages, not both",
            ));
        }
        (Some(text), None) => TokenizeInput::Text(text.to_string()),
        (None, Some(m)) => {
            let chat_template_kwargs = match f.get("chat_template_kwargs") {
                None => Default::default(),
                Some(Value::Object(m)) => m.clone(),
                Some(other) => {
                    return Err(ApiError::invalid(
                        "chat_template_kwargs",
                        format!(
                            "chat_template_kwargs must be an object, got {}",
                            type_name(other)
                        ),
                    ));
                }
            };
            TokenizeInput::Chat {
                messages: parse_messages(Some(m), opts.max_messages)?,
                tools: parse_tools(f.get("tools"))?,
                add_generation_prompt: f.bool("add_generation_prompt")?.unwrap_or(true),
                chat_template_kwargs,
            }
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt or messages is required",
            ));
        }
    };
    let add_special_tokens = f.bool("add_special_tokens")?;
    let return_token_strs = f.bool("return_token_strs")?.unwrap_or(false);
    Ok(TokenizeRequest {
        model,
        input,
        add_special_tokens,
        return_token_strs,
    })
}

pub fn parse_detokenize_request(body: &Value) -> Result<DetokenizeRequest> {
    let mut f = root(body)?;
    let model = f.string("model")?.map(str::to_string);
    let tokens = match f.get("tokens") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| token_id(v, &format!("tokens[{i}]")))
            .collect::<Result<Vec<u32>>>()?,
        Some(other) => {
            return Err(ApiError::invalid(
                "tokens",
                format!(
                    "tokens must be an array of integers, got {}",
                    type_name(other)
                ),
            ));
        }
        None => return Err(ApiError::invalid("tokens", "tokens is required")),
    };
    Ok(DetokenizeRequest { model, tokens })
}

/// Every id must be below the vocabulary size (vLLM `test_out_of_vocab_token_ids`).
pub fn check_token_ids(tokens: &[u32], vocab_size: usize, param: &str) -> Result<()> {
    match tokens.iter().position(|&t| t as usize >= vocab_size) {
        Some(i) => Err(ApiError::invalid(
            format!("{param}[{i}]"),
            format!(
                "token id {} is out of vocabulary (size {vocab_size})",
                tokens[i]
            ),
        )),
        None => Ok(()),
    }
}
