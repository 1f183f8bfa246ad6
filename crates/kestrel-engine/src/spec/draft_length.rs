//! A sequence's draft length, optionally adapted to what it accepts.
//!
//! Every draft a step verifies costs a row of the forward whether it is
//! accepted or not, and acceptance differs by request far more than by
//! position: code that repeats its context accepts long runs, free prose
//! few. With adaptation on, a sequence starts at the configured length,
//! grows by two after a step that accepted every draft it carried at its
//! full length, and shrinks by one after a step that rejected one, never
//! below one draft. (This is the schedule transformers' assisted
//! generation calls "heuristic".) Output is unchanged: drafts only decide
//! how many tokens a step may emit, never which.

/// How many drafts a sequence may carry into its next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DraftLength {
    /// The configured length and the row budget decide, step by step.
    Configured,
    /// Adapted: `current` drafts at most, between 1 and `max`.
    Adaptive { current: usize, max: usize },
}

/// Drafts added after a step that accepted all of a full-length run.
const GROWTH: usize = 2;

impl DraftLength {
    /// Adaptation starting at `max`, the configured length.
    pub fn adaptive(max: usize) -> Self {
        let max = max.max(1);
        DraftLength::Adaptive { current: max, max }
    }

    /// The most drafts the next step may carry (`usize::MAX`: no bound of
    /// its own).
    pub fn limit(&self) -> usize {
        match *self {
            DraftLength::Configured => usize::MAX,
            DraftLength::Adaptive { current, .. } => current,
        }
    }

    /// A step verified `drafted` drafts and accepted `accepted` of them.
    /// A run shorter than `current` (shortened by the row budget, the tokens
    /// left or the proposer) that was accepted whole says nothing about a
    /// longer one, so it does not grow the length.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        let DraftLength::Adaptive { current, max } = self else {
            return;
        };
        if accepted < drafted {
            *current = current.saturating_sub(1).max(1);
        } else if drafted >= *current {
            *current = (*current + GROWTH).min(*max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_lengths_never_bound_or_change() {
        let mut l = DraftLength::Configured;
        l.record(4, 0);
        l.record(4, 4);
        assert_eq!(l, DraftLength::Configured);
        assert_eq!(l.limit(), usize::MAX);
    }

    #[test]
    fn rejections_shrink_by_one_down_to_one_and_full_runs_grow_by_two_up_to_the_max() {
        let mut l = DraftLength::adaptive(7);
        assert_eq!(l.limit(), 7);
        for expected in [6, 5, 4, 3, 2, 1, 1] {
            let drafted = l.limit();
            l.record(drafted, 0);
            assert_eq!(l.limit(), expected);
        }
        for expected in [3, 5, 7, 7] {
            let drafted = l.limit();
            l.record(drafted, drafted);
            assert_eq!(l.limit(), expected);
        }
        // A partial acceptance is a rejection.
        l.record(7, 6);
        assert_eq!(l.limit(), 6);
    }

    #[test]
    fn a_short_run_accepted_whole_does_not_grow_the_length() {
        let mut l = DraftLength::adaptive(8);
        l.record(8, 2);
        l.record(7, 1);
        assert_eq!(l.limit(), 6);
        // The row budget cut the run to 2: accepting both says nothing of 6.
        l.record(2, 2);
        assert_eq!(l.limit(), 6);
        l.record(6, 6);
        assert_eq!(l.limit(), 8);
    }
}
