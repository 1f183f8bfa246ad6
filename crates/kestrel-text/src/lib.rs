//! Text side of kestrel: tokenizer, chat template and incremental detokenisation.
//!
//! * [`Tokenizer`] wraps a Hugging Face `tokenizer.json` (the `tokenizers`
//!   crate) and knows the model's end-of-sequence ids:
//!   `Tokenizer::from_model_dir(dir)` or `Tokenizer::from_file(path)`, then
//!   `encode(text, add_special) -> Vec<u32>`, `decode(ids, skip_special) -> String`,
//!   `token_id(text) -> Option<u32>`, `vocab_size()`, `eos_token_ids()`.
//!   Special-token strings written in the text (`<|im_start|>`, `<think>`, ...)
//!   always encode to their ids, as in Hugging Face and tiktoken.
//! * [`ChatTemplate`] renders a model's Jinja chat template the way
//!   transformers' `apply_chat_template(..., tokenize=False)` does, byte for
//!   byte: `ChatTemplate::from_model_dir(dir) -> Option<ChatTemplate>`, then
//!   `render(messages, tools, add_generation_prompt, extra_kwargs)`. Messages
//!   and tools are `serde_json::Value`s passed through unchanged; extra kwargs
//!   (`enable_thinking`, `preserve_thinking`, ...) become template variables.
//!   Errors raised by the template itself (`raise_exception`) are reported as
//!   [`TemplateError::Raised`] so a server can answer 400.
//! * [`Detokenizer`] turns a stream of generated ids into text deltas that never
//!   split a UTF-8 character and whose concatenation equals the full decode.
//!
//! Every error names the file or input it came from; malformed files never
//! panic.
//!
//! ```no_run
//! use kestrel_text::{ChatTemplate, Detokenizer, Tokenizer};
//! use serde_json::{Map, json};
//!
//! # fn main() -> anyhow::Result<()> {
//! let dir = "models/Qwen3.6-35B-A3B";
//! let tokenizer = Tokenizer::from_model_dir(dir)?;
//! let template = ChatTemplate::from_model_dir(dir)?.expect("model has a chat template");
//! let messages = [json!({"role": "user", "content": "Hello!"})];
//! let mut kwargs = Map::new();
//! kwargs.insert("enable_thinking".into(), json!(false));
//! let prompt = template.render(&messages, None, true, &kwargs)?;
//! let prompt_ids = tokenizer.encode(&prompt, false)?;
//!
//! let mut detok = Detokenizer::with_context(&tokenizer, true, &prompt_ids);
//! for id in [9707u32, 0] {
//!     print!("{}", detok.push(id)?);
//! }
//! print!("{}", detok.finish());
//! # Ok(())
//! # }
//! ```

mod detokenizer;
mod model_files;
pub mod parallel_encode;
mod template;
mod token_bytes;
mod tokenizer;

pub use detokenizer::Detokenizer;
pub use template::{ChatTemplate, TemplateError};
pub use tokenizer::Tokenizer;
