//! Stop strings over streamed text: text that could still be the start of a stop string is held
//! back until it either completes one (generation ends, the stop string is not shown) or can no
//! longer match (it is released).

/// Matches stop strings across token boundaries.
///
/// ```
/// use pacer_engine::stop::StopMatcher;
///
/// let mut m = StopMatcher::new(["\nUser:".to_string()]);
/// assert_eq!(m.push("Sure.\nUs").text, "Sure."); // "\nUs" is held: it may start the stop
/// let end = m.push("er: next");
/// assert!(end.stopped && end.text.is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What a chunk of text produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to show now.
    pub text: String,
    /// Whether a stop string was completed (the sequence must end).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Feeds newly decoded text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome { text: text.to_string(), stopped: false };
        }
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            return StopOutcome { text: out, stopped: true };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&self.held[i..])))
            .unwrap_or(self.held.len());
        let out = self.held[..keep].to_string();
        self.held.drain(..keep);
        StopOutcome { text: out, stopped: false }
    }

    /// Releases held text at the end of a sequence that did not stop on a string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_split_across_chunks_is_caught_and_hidden() {
        let mut m = StopMatcher::new(["\n\nUser:".to_string()]);
        assert_eq!(m.push("Hello"), StopOutcome { text: "Hello".into(), stopped: false });
        assert_eq!(m.push(" world\n"), StopOutcome { text: " world".into(), stopped: false });
        assert_eq!(m.push("\nUs"), StopOutcome { text: "".into(), stopped: false });
        assert_eq!(m.push("er: hi"), StopOutcome { text: "".into(), stopped: true });
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        let mut m = StopMatcher::new(["END".to_string()]);
        assert_eq!(m.push("the EN").text, "the ");
        assert_eq!(m.push("Dless").text, "");
        let mut m = StopMatcher::new(["END".to_string()]);
        assert_eq!(m.push("EN").text, "");
        assert_eq!(m.push("G").text, "ENG");
        assert_eq!(m.push("E").text, "");
        assert_eq!(m.flush(), "E");
    }

    #[test]
    fn multibyte_text_is_split_on_char_boundaries() {
        let mut m = StopMatcher::new(["é!".to_string()]);
        assert_eq!(m.push("café").text, "caf");
        assert_eq!(m.push("?").text, "é?");
    }
}
