//! Compiling requests' grammars against the model's vocabulary.
//!
//! The tokenizer-wide state (the token trie and llguidance's parser
//! factory) is built once, on the first constrained request, so servers
//! that never see one pay nothing at start-up. Compiling is CPU work that
//! can take long for a large schema: callers run it off the engine thread
//! and off the async workers (the server uses `spawn_blocking`). Its time
//! and size are bounded by llguidance's parser limits.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use kestrel_engine::Constraint;
use llguidance::{Matcher, ParserFactory};

use crate::grammar::{GrammarStart, OutputGrammar, top_level};
use crate::matcher::GrammarConstraint;
use crate::vocabulary::token_env;

/// Why a constraint could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// The request's schema, regex or grammar: a 400 with this reason.
    #[error("{0}")]
    Invalid(String),
    /// The model's vocabulary could not be read for structured outputs.
    #[error("structured outputs are unavailable for this model: {0}")]
    Unavailable(String),
}

/// Lexer work allowed for one token mask (llguidance's unit; its default
/// is 200,000).
const STEP_LEXER_FUEL: u64 = 1_000_000;

/// Compiles grammars for one model.
pub struct GrammarCompiler {
    source: VocabularySource,
    eos: Arc<[u32]>,
    factory: OnceLock<Result<ParserFactory, String>>,
}

/// Where the vocabulary comes from.
enum VocabularySource {
    File(PathBuf),
    Bytes(Vec<u8>),
}

impl GrammarCompiler {
    /// For the `tokenizer.json` at `path` (read on first use) and the
    /// model's end-of-sequence ids.
    pub fn from_tokenizer_file(path: impl Into<PathBuf>, eos_token_ids: &[u32]) -> Self {
        Self::new(VocabularySource::File(path.into()), eos_token_ids)
    }

    /// For the contents of a `tokenizer.json`.
    pub fn from_tokenizer_json(bytes: Vec<u8>, eos_token_ids: &[u32]) -> Self {
        Self::new(VocabularySource::Bytes(bytes), eos_token_ids)
    }

    fn new(source: VocabularySource, eos_token_ids: &[u32]) -> Self {
        GrammarCompiler {
            source,
            eos: eos_token_ids.into(),
            factory: OnceLock::new(),
        }
    }

    /// The engine constraint of `output`. Errors in the request's grammar
    /// are [`CompileError::Invalid`] with llguidance's reason.
    pub fn compile(
        &self,
        output: &OutputGrammar<'_>,
        start: GrammarStart,
    ) -> Result<Constraint, CompileError> {
        let factory = self
            .factory()
            .map_err(|e| CompileError::Unavailable(e.clone()))?;
        let parser = factory
            .create_parser(top_level(output, start).map_err(CompileError::Invalid)?)
            .map_err(|e| CompileError::Invalid(without_backtrace(e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        // The first mask finds grammars that cannot produce anything.
        if let Err(e) = matcher.compute_mask() {
            return Err(CompileError::Invalid(e.to_string()));
        }
        Ok(Constraint::new(GrammarConstraint::new(
            matcher,
            self.eos.clone(),
        )))
    }

    fn factory(&self) -> Result<&ParserFactory, &String> {
        self.factory
            .get_or_init(|| self.build_factory().map_err(|e| format!("{e:#}")))
            .as_ref()
    }

    fn build_factory(&self) -> anyhow::Result<ParserFactory> {
        let bytes = match &self.source {
            VocabularySource::File(path) => std::fs::read(path)?,
            VocabularySource::Bytes(bytes) => bytes.clone(),
        };
        let env = token_env(&bytes, &self.eos)?;
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        // Errors go back to clients: no parser state or grammar dump in them.
        factory.limits_mut().verbose_errors = false;
        // Five times llguidance's default lexer budget per mask: a forced
        // XML call's raw string value with a length bound and the
        // exclusion of its closing tags is a product of small automata
        // whose first mask, walked over a whole vocabulary, needs several
        // times the default (the request failed with "too many
        // expressions constructed"); with this budget such a mask takes
        // about 20 ms over Qwen3.6's 248K tokens on one CPU core, once
        // (later masks reuse the lexer states).
        factory.limits_mut().step_lexer_fuel = STEP_LEXER_FUEL;
        Ok(factory)
    }
}

/// llguidance reports a panic it caught inside a compile with the
/// backtrace appended; the reason goes to the client, the backtrace not.
fn without_backtrace(mut reason: String) -> String {
    if let Some(at) = reason.find("\n<backtrace>") {
        reason.truncate(at);
    }
    reason
}
