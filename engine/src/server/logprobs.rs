//! Log probabilities in OpenAI's two shapes: chat's `{"content": [{token, logprob, bytes,
//! top_logprobs}]}` and legacy completions' parallel lists (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`). A streamed response sends, in each chunk, the entries of the
//! tokens whose text that chunk releases.

use crate::sampling::TokenLogprob;
use crate::tokenizer::Tokenizer;
use serde_json::{Value, json};

/// Builds the `logprobs` objects of one response, chunk by chunk.
#[derive(Debug, Default)]
pub struct LogprobsWriter {
    /// Characters of answer text before the next token (completions' `text_offset`).
    offset: usize,
}

/// A token as text: its bytes (invalid UTF-8, as half a character is, shown lossily), or the
/// name of a control token, which has none.
fn text_of(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.bytes_of(id).to_vec();
    if bytes.is_empty() {
        return (tokenizer.token(id).unwrap_or_default().to_string(), bytes);
    }
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

impl LogprobsWriter {
    /// Chat's object for `entries`.
    pub fn chat(&mut self, tokenizer: &Tokenizer, entries: &[TokenLogprob]) -> Value {
        let one = |id: u32, logprob: f32| {
            let (token, bytes) = text_of(tokenizer, id);
            json!({"token": token, "logprob": logprob, "bytes": bytes})
        };
        let content: Vec<Value> = entries
            .iter()
            .map(|e| {
                let mut v = one(e.token, e.logprob);
                v["top_logprobs"] = e.top.iter().map(|&(id, lp)| one(id, lp)).collect();
                v
            })
            .collect();
        json!({"content": content, "refusal": null})
    }

    /// Legacy completions' object for `entries`.
    pub fn completions(&mut self, tokenizer: &Tokenizer, entries: &[TokenLogprob]) -> Value {
        let mut tokens = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top = Vec::new();
        let mut offsets = Vec::new();
        for e in entries {
            let (token, _) = text_of(tokenizer, e.token);
            offsets.push(self.offset);
            self.offset += token.chars().count();
            tokens.push(token);
            token_logprobs.push(e.logprob);
            let alternatives: serde_json::Map<String, Value> =
                e.top.iter().map(|&(id, lp)| (text_of(tokenizer, id).0, json!(lp))).collect();
            top.push(Value::Object(alternatives));
        }
        json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
    }
}
