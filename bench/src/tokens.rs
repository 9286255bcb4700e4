//! Local token counting, for servers that send no `usage`: a Hugging Face `tokenizer.json`, or
//! the tokenizer inside a GGUF (read by Pacer's engine, no model hub needed).

use std::path::Path;

/// Counts tokens of generated text.
pub enum TokenCounter {
    /// A `tokenizer.json`.
    Json(Box<tokenizers::Tokenizer>),
    /// The tokenizer of a GGUF model.
    Gguf(Box<pacer_engine::Tokenizer>),
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TokenCounter::Json(_) => "TokenCounter::Json",
            TokenCounter::Gguf(_) => "TokenCounter::Gguf",
        })
    }
}

impl TokenCounter {
    /// Loads `path`: `.gguf` files through the engine's GGUF tokenizer, anything else as a
    /// `tokenizer.json`.
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

    /// Tokens in `text` (no special tokens added).
    pub fn count(&self, text: &str) -> usize {
        match self {
            TokenCounter::Json(t) => t.encode(text, false).map_or(0, |e| e.len()),
            TokenCounter::Gguf(t) => t.encode(text).map_or(0, |ids| ids.len()),
        }
    }
}
