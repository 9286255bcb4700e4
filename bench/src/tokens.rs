//! Local token counting, for servers that send no `usage`: a Hugging Face `tokenizer.json`, or
//! the tokenizer inside a GGUF (read by Pacer's engine, no model hub needed). Both come with the
//! `tokenizer` feature (on by default); without it (as in the operator, which generates load but
//! counts no tokens) [`TokenCounter::open`] says so.

use std::path::Path;

/// Counts tokens of generated text.
pub enum TokenCounter {
    /// A `tokenizer.json`.
    #[cfg(feature = "tokenizer")]
    Json(Box<tokenizers::Tokenizer>),
    /// The tokenizer of a GGUF model.
    #[cfg(feature = "tokenizer")]
    Gguf(Box<pacer_engine::Tokenizer>),
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(feature = "tokenizer")]
        return f.write_str(match self {
            TokenCounter::Json(_) => "TokenCounter::Json",
            TokenCounter::Gguf(_) => "TokenCounter::Gguf",
        });
        #[cfg(not(feature = "tokenizer"))]
        {
            let _ = f;
            match *self {}
        }
    }
}

impl TokenCounter {
    /// Loads `path`: `.gguf` files through the engine's GGUF tokenizer, anything else as a
    /// `tokenizer.json`.
    #[cfg(feature = "tokenizer")]
    pub fn open(path: &Path) -> Result<Self, String> {
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            let (content, _) = pacer_engine::model::read_content(path).map_err(|e| e.to_string())?;
            let t = pacer_engine::Tokenizer::from_gguf(&content).map_err(|e| e.to_string())?;
            return Ok(TokenCounter::Gguf(Box::new(t)));
        }
        tokenizers::Tokenizer::from_file(path)
            .map(|t| TokenCounter::Json(Box::new(t)))
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Without the `tokenizer` feature: an error that says so.
    #[cfg(not(feature = "tokenizer"))]
    pub fn open(path: &Path) -> Result<Self, String> {
        Err(format!("{}: pacer-bench was built without the `tokenizer` feature", path.display()))
    }

    /// Tokens in `text` (no special tokens added).
    pub fn count(&self, text: &str) -> usize {
        #[cfg(feature = "tokenizer")]
        return match self {
            TokenCounter::Json(t) => t.encode(text, false).map_or(0, |e| e.len()),
            TokenCounter::Gguf(t) => t.encode(text).map_or(0, |ids| ids.len()),
        };
        #[cfg(not(feature = "tokenizer"))]
        {
            let _ = text;
            match *self {}
        }
    }
}
