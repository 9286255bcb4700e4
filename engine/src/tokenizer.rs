//! The tokenizer, built from GGUF metadata alone (no `tokenizer.json`, no model hub): a
//! byte-level BPE from `tokenizer.ggml.tokens` / `merges`, the pre-tokenizer that
//! `tokenizer.ggml.pre` names (as llama.cpp maps it), control tokens as single special ids, and
//! a streaming decoder that never splits a UTF-8 character.

use crate::error::EngineError;
use candle_core::quantized::gguf_file::{Content, Value};
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior};

/// GGUF `token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Llama 3's split regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Names of end-of-turn tokens that stop generation when the vocabulary has them.
const END_OF_TURN: &[&str] = &["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"];

/// A GGUF model's tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Raw bytes each id decodes to (empty for special tokens, which are not shown).
    token_bytes: Vec<Vec<u8>>,
    tokens: Vec<String>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
    chat_template: Option<String>,
    /// The most text bytes one token can stand for (see [`Tokenizer::max_text_bytes`]).
    max_token_bytes: usize,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &self.tokens.len()).field("eos", &self.eos).finish()
    }
}

fn strings(c: &Content, key: &str) -> Result<Vec<String>, EngineError> {
    let v =
        c.metadata.get(key).ok_or_else(|| EngineError::Tokenizer(format!("GGUF metadata has no `{key}`")))?;
    v.to_vec()
        .map_err(|e| EngineError::Tokenizer(format!("`{key}`: {e}")))?
        .iter()
        .map(|s| s.to_string().cloned().map_err(|e| EngineError::Tokenizer(format!("`{key}`: {e}"))))
        .collect()
}

fn id(c: &Content, key: &str) -> Option<u32> {
    c.metadata.get(key).and_then(|v| v.to_u32().ok())
}

/// GPT-2's reversible byte ↔ printable-character map, inverted: character → byte.
fn byte_level_decoding() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut extra = 0u32;
    for b in 0u32..=255 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let ch = if printable {
            char::from_u32(b)
        } else {
            extra += 1;
            char::from_u32(255 + extra)
        };
        if let Some(ch) = ch {
            map.insert(ch, b as u8);
        }
    }
    map
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, EngineError> {
    let byte_level = |regex: bool| PreTokenizerWrapper::from(ByteLevel::new(false, true, regex));
    Ok(match pre {
        // Digits one by one, then GPT-2's regex (llama.cpp: "\p{N}" then the GPT-2 pattern).
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into()
        }
        "gpt-2" | "gpt2" | "default" => byte_level(true),
        "llama-bpe" | "llama3" => {
            let split =
                Split::new(SplitPattern::Regex(LLAMA3_SPLIT.into()), SplitDelimiterBehavior::Isolated, false)
                    .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
            Sequence::new(vec![split.into(), byte_level(false)]).into()
        }
        other => {
            return Err(EngineError::Tokenizer(format!(
                "pre-tokenizer `{other}` is not supported (supported: smollm, starcoder, gpt-2, llama-bpe)"
            )));
        }
    })
}

/// About how many bytes [`Tokenizer::encode_within`] tokenizes at a time.
pub const CHUNK_BYTES: usize = 16 * 1024;

/// A text with more tokens than a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong {
    /// Tokens it has at least.
    pub at_least: usize,
    /// Bytes of it looked at before that was sure.
    pub read: usize,
}

/// The first place at or after `from` where `text` can be cut without changing its tokens: a
/// space after a character that is not whitespace. Every supported pre-tokenizer (GPT-2's
/// pattern, digits one by one, Llama 3's pattern) starts a piece there, BPE never merges across
/// pieces, and no special token holds a space. The text's end when there is no such place.
fn piece_end(text: &str, from: usize) -> usize {
    let bytes = text.as_bytes();
    let mut i = from.max(1);
    while i < bytes.len() {
        // `i` is a char boundary when the byte there is a space; the one before is the last
        // byte of the previous char, which is whitespace only if it is ASCII whitespace or
        // the end of a multi-byte whitespace char.
        if bytes[i] == b' ' && text.is_char_boundary(i) {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| !c.is_whitespace()) {
                return i;
            }
        }
        i += 1;
    }
    bytes.len()
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(c: &Content) -> Result<Self, EngineError> {
        let model = c.metadata.get("tokenizer.ggml.model").and_then(|v| v.to_string().ok());
        if model.map(String::as_str) != Some("gpt2") {
            return Err(EngineError::Tokenizer(format!(
                "tokenizer model {model:?} is not supported (byte-level BPE, `gpt2`, only)"
            )));
        }
        let tokens = strings(c, "tokenizer.ggml.tokens")?;
        let merges = strings(c, "tokenizer.ggml.merges")?;
        let types: Vec<i32> = match c.metadata.get("tokenizer.ggml.token_type").and_then(|v| v.to_vec().ok())
        {
            Some(v) => v.iter().map(|t| t.to_i32().unwrap_or(1)).collect(),
            None => vec![1; tokens.len()],
        };
        let pre = c
            .metadata
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.to_string().ok())
            .map_or("default", String::as_str);

        let vocab: tokenizers::models::bpe::Vocab =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges = merges
            .iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| EngineError::Tokenizer(format!("malformed merge `{m}`")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| EngineError::Tokenizer(format!("building BPE: {e}")))?;
        let mut inner = tokenizers::Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
        inner.with_decoder(Some(ByteLevel::default()));
        let special: Vec<bool> =
            types.iter().map(|&t| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED).collect();
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&special)
            .filter(|(_, s)| **s)
            .map(|(t, _)| AddedToken::from(t.clone(), true))
            .collect();
        inner
            .add_special_tokens(added)
            .map_err(|e| EngineError::Tokenizer(format!("adding special tokens: {e}")))?;

        let table = byte_level_decoding();
        let token_bytes: Vec<Vec<u8>> =
            tokens
                .iter()
                .zip(&special)
                .map(|(t, &s)| {
                    if s { Vec::new() } else { t.chars().filter_map(|ch| table.get(&ch).copied()).collect() }
                })
                .collect();
        let eos = id(c, "tokenizer.ggml.eos_token_id");
        let mut stop_ids: Vec<u32> = eos.into_iter().collect();
        for name in END_OF_TURN {
            if let Some(i) = tokens.iter().position(|t| t == name) {
                stop_ids.push(i as u32);
            }
        }
        stop_ids.sort_unstable();
        stop_ids.dedup();
        // A token's vocabulary string is at least as long as the text it matches: byte-level
        // tokens spell each byte as one or two UTF-8 bytes, special tokens are their own text.
        let max_token_bytes =
            tokens.iter().map(String::len).chain(token_bytes.iter().map(Vec::len)).max().unwrap_or(1).max(1);
        Ok(Tokenizer {
            max_token_bytes,
            inner,
            token_bytes,
            bos: id(c, "tokenizer.ggml.bos_token_id"),
            eos,
            add_bos: c
                .metadata
                .get("tokenizer.ggml.add_bos_token")
                .and_then(|v| v.to_bool().ok())
                .unwrap_or(false),
            stop_ids,
            chat_template: c
                .metadata
                .get("tokenizer.chat_template")
                .and_then(|v| v.to_string().ok())
                .cloned(),
            tokens,
        })
    }

    /// The longest text, in bytes, that can tokenize to at most `tokens` tokens: a longer text
    /// surely needs more, so it can be refused without tokenizing it (which takes seconds for
    /// megabytes of text).
    pub fn max_text_bytes(&self, tokens: usize) -> usize {
        tokens.saturating_mul(self.max_token_bytes)
    }

    /// Token ids of `text`. Special-token text (e.g. `<|im_start|>`) becomes its single id, as
    /// in a rendered chat template; BOS is prepended when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let enc = self.inner.encode(text, false).map_err(|e| EngineError::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Token ids of `text` as [`Tokenizer::encode`] gives them, or [`TooLong`] as soon as
    /// there are `limit` of them: a long text is tokenized in pieces of about [`CHUNK_BYTES`],
    /// so refusing megabytes of text costs about what tokenizing `limit` tokens costs, not
    /// the whole text.
    pub fn encode_within(&self, text: &str, limit: usize) -> Result<Result<Vec<u32>, TooLong>, EngineError> {
        self.encode_chunked(text, limit, CHUNK_BYTES)
    }

    /// As [`Tokenizer::encode_within`], in pieces of about `chunk` bytes (tests cut tiny pieces
    /// to put a cut at every place one can fall).
    pub fn encode_chunked(
        &self,
        text: &str,
        limit: usize,
        chunk: usize,
    ) -> Result<Result<Vec<u32>, TooLong>, EngineError> {
        let mut ids = Vec::new();
        if self.add_bos
            && let Some(b) = self.bos
        {
            ids.push(b);
        }
        let mut start = 0;
        while start < text.len() {
            let end = piece_end(text, start + chunk);
            // One piece's tokens are at least its bytes over the longest token's: a piece too
            // long for the room left is refused without running BPE over it.
            if ids.len() + (end - start) / self.max_token_bytes >= limit {
                return Ok(Err(TooLong {
                    at_least: ids.len() + (end - start) / self.max_token_bytes,
                    read: end,
                }));
            }
            let enc = self
                .inner
                .encode(&text[start..end], false)
                .map_err(|e| EngineError::Tokenizer(e.to_string()))?;
            ids.extend_from_slice(enc.get_ids());
            if ids.len() >= limit && end < text.len() {
                return Ok(Err(TooLong { at_least: ids.len(), read: end }));
            }
            start = end;
        }
        Ok(Ok(ids))
    }

    /// Text of `ids` (special tokens omitted). Invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.bytes_of(i).iter().copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes of one token (empty for special tokens and unknown ids).
    pub fn bytes_of(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// The vocabulary string of a token.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
    /// End-of-sequence id.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    /// Beginning-of-sequence id.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    /// Ids that end generation: EOS and the model's end-of-turn tokens.
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }
    /// Writes the tokenizer as Hugging Face files (`tokenizer.json`, `tokenizer_config.json`)
    /// into `dir`, for tools that load tokenizers that way (benchmarks, evaluation harnesses).
    pub fn export_hf(&self, dir: &std::path::Path) -> Result<(), EngineError> {
        std::fs::create_dir_all(dir)?;
        self.inner
            .save(dir.join("tokenizer.json"), true)
            .map_err(|e| EngineError::Tokenizer(format!("writing tokenizer.json: {e}")))?;
        let name = |id: Option<u32>| id.and_then(|i| self.token(i)).map(str::to_string);
        let config = serde_json::json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": name(self.bos),
            "eos_token": name(self.eos),
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
            "model_max_length": 1_000_000_000u64,
        });
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&config).unwrap_or_default(),
        )?;
        Ok(())
    }

    /// The chat template stored in the GGUF, if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

/// Incremental detokenizer: feed ids, get text; bytes of a character split across tokens are
/// held until the character is complete.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the bytes of `id` and returns the text that is now complete.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.pending.extend_from_slice(tokenizer.bytes_of(id));
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        // Bytes that can never become valid: replace them and go on.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is still pending at the end of a sequence, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// Reads a string value from GGUF metadata.
pub fn metadata_string(c: &Content, key: &str) -> Option<String> {
    c.metadata.get(key).and_then(|v| match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_is_a_bijection() {
        let t = byte_level_decoding();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
    }

    #[test]
    fn unknown_pre_tokenizers_are_rejected_by_name() {
        let err = pre_tokenizer("qwen2").unwrap_err().to_string();
        assert!(err.contains("qwen2"), "{err}");
    }
}
