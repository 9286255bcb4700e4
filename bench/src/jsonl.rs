//! JSON lines, the format of `--requests-jsonl`, datasets and simulator replays: one value per
//! line, blank lines skipped, and an error that names the line (1-based, counting blank lines).

use serde::de::DeserializeOwned;

/// Every value of `text`, or the first line that is not one.
pub fn parse<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn blank_lines_are_skipped_and_errors_name_the_line() {
        assert_eq!(super::parse::<u32>("1\n\n  \n2\n"), Ok(vec![1, 2]));
        let err = super::parse::<u32>("1\n\nx\n").unwrap_err();
        assert!(err.starts_with("line 3: "), "{err}");
    }
}
