//! Stop strings across chunk boundaries.

mod common;

use kestrel_api::stop::StopMatcher;

/// Streams the chunks; returns (text, matched stop index).
fn run(stops: &[&str], include: bool, chunks: &[String]) -> (String, Option<usize>) {
    let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include);
    let mut out = String::new();
    for chunk in chunks {
        let d = m.push(chunk);
        out.push_str(&d.text);
        if d.stopped.is_some() {
            assert!(m.push("more").text.is_empty(), "nothing after a stop");
            return (out, d.stopped);
        }
    }
    out.push_str(&m.finish());
    (out, None)
}

#[track_caller]
fn check(stops: &[&str], include: bool, text: &str, expected: &str, stop: Option<usize>) {
    for chunks in common::chunkings(text) {
        assert_eq!(
            run(stops, include, &chunks),
            (expected.to_string(), stop),
            "chunks {chunks:?}"
        );
    }
}

#[test]
fn trims_stop_string_across_chunks() {
    check(&["END"], false, "hello END world", "hello ", Some(0));
    check(&["END"], true, "hello END world", "hello END", Some(0));
    check(
        &["\n\n"],
        false,
        "line one\nline two\n\nnext",
        "line one\nline two",
        Some(0),
    );
}

#[test]
fn earliest_of_several_stops_wins() {
    check(&["world", "lo w"], false, "hello world", "hel", Some(1));
    check(&["abc", "bc"], false, "xabc", "x", Some(0));
    check(&["bcd", "yxab"], false, "yxabcd", "", Some(1));
    // Overlapping stops: the one that completes first ends generation, as
    // in an engine that checks after every token.
    let mut m = StopMatcher::new(vec!["bcd".into(), "abcde".into()], false);
    assert_eq!(m.push("xabc").text, "x");
    assert_eq!(m.push("d").stopped, Some(0));
}

#[test]
fn near_misses_are_released() {
    check(&["END"], false, "EN EN ENDING", "EN EN ", Some(0));
    check(&["END"], false, "the EN", "the EN", None);
    check(&["stop"], false, "no match here", "no match here", None);
    check(&["停止"], false, "文字停止です", "文字", Some(0));
    check(&["停止"], false, "文字停", "文字停", None);
}

#[test]
fn withholds_only_possible_prefixes() {
    let mut m = StopMatcher::new(vec!["STOP".into()], false);
    assert_eq!(m.push("abc S").text, "abc ");
    assert_eq!(m.push("T").text, "");
    assert_eq!(m.push("x").text, "STx");
    assert_eq!(m.push("ST").text, "");
    let d = m.push("OP tail");
    assert_eq!((d.text.as_str(), d.stopped), ("", Some(0)));
    assert!(m.is_stopped());
}
