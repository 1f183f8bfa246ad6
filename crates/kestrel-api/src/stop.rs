//! Stop strings over streamed text. Text that could be the start of a stop
//! string is withheld until the next chunk decides; on a match the output
//! ends before the stop string (or after it, with
//! `include_stop_str_in_output`).

use crate::scan::partial_suffix_len;

/// Output of one step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopDelta {
    /// Text safe to pass on.
    pub text: String,
    /// Index into the stop list of the string that matched; generation
    /// must end (`finish_reason: "stop"`).
    pub stopped: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop_str: bool,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>, include_stop_str_in_output: bool) -> Self {
        let stops = stops.into_iter().filter(|s| !s.is_empty()).collect();
        StopMatcher {
            stops,
            include_stop_str: include_stop_str_in_output,
            held: String::new(),
            stopped: false,
        }
    }

    /// The stop string of a [`StopDelta::stopped`] index.
    pub fn stop_string(&self, index: usize) -> Option<&str> {
        self.stops.get(index).map(String::as_str)
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    pub fn push(&mut self, text: &str) -> StopDelta {
        if self.stopped {
            return StopDelta::default();
        }
        self.held.push_str(text);
        // Earliest match; at equal positions the longest string.
        let found = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|p| (p, i)))
            .min_by_key(|&(p, i)| (p, std::cmp::Reverse(self.stops[i].len())));
        if let Some((pos, i)) = found {
            let end = if self.include_stop_str {
                pos + self.stops[i].len()
            } else {
                pos
            };
            self.held.truncate(end);
            self.stopped = true;
            return StopDelta {
                text: std::mem::take(&mut self.held),
                stopped: Some(i),
            };
        }
        let tags: Vec<&str> = self.stops.iter().map(String::as_str).collect();
        let keep = partial_suffix_len(&self.held, &tags);
        let text = self.held.drain(..self.held.len() - keep).collect();
        StopDelta {
            text,
            stopped: None,
        }
    }

    /// End of generation by other means (EOS, length): the withheld text
    /// was not a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
