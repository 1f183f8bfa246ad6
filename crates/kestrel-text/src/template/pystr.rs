//! Python string semantics that templates depend on where Rust's differ.
//!
//! Python's `str.strip()` (and Jinja's `trim` filter, which calls it) treats
//! U+001C..U+001F as whitespace; Rust's `char::is_whitespace` does not. Chat
//! templates trim every message, so a message ending in such a character
//! must come out the same as in transformers.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, State};

/// `str.isspace()` for one character.
pub fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

#[derive(Clone, Copy)]
enum Side {
    Both,
    Start,
    End,
}

fn strip<'a>(s: &'a str, chars: Option<&str>, side: Side) -> &'a str {
    let matches = |c: char| match chars {
        Some(set) => set.contains(c),
        None => is_python_space(c),
    };
    match side {
        Side::Both => s.trim_matches(matches),
        Side::Start => s.trim_start_matches(matches),
        Side::End => s.trim_end_matches(matches),
    }
}

/// Jinja's `trim` filter: `value.strip(chars)`.
pub fn trim_filter(value: &str, chars: Option<&str>) -> String {
    strip(value, chars, Side::Both).to_string()
}

/// Method calls on values that minijinja does not know natively: the
/// `strip` family is handled here with Python whitespace, everything else
/// goes to minijinja-contrib's Python compatibility layer.
pub fn unknown_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if value.kind() == ValueKind::String {
        let side = match method {
            "strip" => Some(Side::Both),
            "lstrip" => Some(Side::Start),
            "rstrip" => Some(Side::End),
            _ => None,
        };
        if let Some(side) = side {
            let (chars,): (Option<&str>,) = minijinja::value::from_args(args)?;
            let s = value.as_str().unwrap_or_default();
            return Ok(Value::from(strip(s, chars, side)));
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_uses_python_whitespace() {
        assert_eq!(trim_filter("\u{1f}\u{a0} x \t\u{3000}\u{1c}", None), "x");
        assert_eq!(trim_filter("xxhixx", Some("x")), "hi");
        assert_eq!(strip("\n\nabc\n", Some("\n"), Side::End), "\n\nabc");
        assert_eq!(strip("\n\nabc\n", None, Side::Start), "abc\n");
    }
}
