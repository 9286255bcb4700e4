//! Requests from a file instead of synthetic prompts: one JSON object per line with `prompt`
//! (text) or `messages` (a chat), optional `max_tokens`, and optional `timestamp` (seconds) for
//! trace replay, e.g.
//!
//! ```text
//! {"prompt": "Summarize: ...", "max_tokens": 128}
//! {"messages": [{"role": "user", "content": "Hi"}], "timestamp": 0.35}
//! ```

use serde::Deserialize;
use serde_json::Value;

/// One request of a dataset or trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetItem {
    /// Prompt text (completions; a single user turn for chat).
    pub prompt: Option<String>,
    /// A whole conversation (chat only).
    pub messages: Option<Vec<Value>>,
    /// Tokens to generate (else the run's `--output-len`).
    pub max_tokens: Option<usize>,
    /// Send time in seconds from the start, for `--replay`.
    pub timestamp: Option<f64>,
}

/// Parses JSON lines; errors name the line.
pub fn parse(text: &str) -> Result<Vec<DatasetItem>, String> {
    let items: Vec<DatasetItem> = crate::jsonl::parse(text)?;
    // The line of the n-th item, for the checks' messages.
    let line_of = |n: usize| {
        text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).nth(n).map_or(0, |(i, _)| i + 1)
    };
    for (n, item) in items.iter().enumerate() {
        if item.prompt.is_none() == item.messages.is_none() {
            return Err(format!("line {}: give exactly one of `prompt` and `messages`", line_of(n)));
        }
        if item.timestamp.is_some_and(|t| t.is_nan() || t < 0.0) {
            return Err(format!("line {}: `timestamp` must be a non-negative number of seconds", line_of(n)));
        }
    }
    if items.is_empty() {
        return Err("the dataset has no requests".into());
    }
    Ok(items)
}

/// Replay times of `items` scaled by `speedup` (2 = twice as fast), rebased to start at 0.
pub fn replay_schedule(items: &[DatasetItem], speedup: f64) -> Result<Vec<f64>, String> {
    let ts: Vec<f64> = items
        .iter()
        .enumerate()
        .map(|(i, it)| it.timestamp.ok_or_else(|| format!("request {} has no `timestamp` to replay", i + 1)))
        .collect::<Result<_, _>>()?;
    let start = ts.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(ts.into_iter().map(|t| (t - start) / speedup).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_errors_name_the_line() {
        let items =
            parse("{\"prompt\": \"a\", \"max_tokens\": 3}\n\n{\"messages\": [], \"timestamp\": 1.5}\n")
                .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].max_tokens, Some(3));
        assert!(parse("{\"prompt\": \"a\"}\n{\"prompt\": 1}").unwrap_err().starts_with("line 2"));
        assert!(parse("{\"max_tokens\": 3}").unwrap_err().contains("exactly one"));
        assert!(parse("{\"prompt\": \"a\", \"stream\": true}").unwrap_err().contains("unknown field"));
    }

    #[test]
    fn replay_rebases_and_scales_timestamps() {
        let items =
            parse("{\"prompt\":\"a\",\"timestamp\":10}\n{\"prompt\":\"b\",\"timestamp\":12}").unwrap();
        assert_eq!(replay_schedule(&items, 2.0).unwrap(), vec![0.0, 1.0]);
        let no_ts = parse("{\"prompt\":\"a\"}").unwrap();
        assert!(replay_schedule(&no_ts, 1.0).is_err());
    }
}
