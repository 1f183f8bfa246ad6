//! Python `json.dumps` output for template values, as transformers' `tojson`
//! filter produces it: `", "` and `": "` separators (`","` between items when
//! indenting), no HTML escaping, non-ASCII kept unless `ensure_ascii`, and
//! floats written the way Python's `repr(float)` writes them.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// The keyword arguments of `json.dumps` that `tojson` exposes.
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// Text repeated per nesting level; `None` writes everything on one line.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        Self {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// Serialises `value` like `json.dumps(value, **options)`.
pub fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(value, options, 0, &mut out)?;
    Ok(out)
}

fn not_serialisable(what: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("tojson: object of type {what} is not JSON serializable"),
    )
}

fn write_value(
    value: &Value,
    options: &DumpOptions,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(value, out)?,
        ValueKind::String => write_string(
            value.as_str().unwrap_or_default(),
            options.ensure_ascii,
            out,
        ),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, options, depth, '[', ']', &items, |item, out| {
                write_value(item, options, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_text(&key)?, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                options,
                depth,
                '{',
                '}',
                &entries,
                |(key, item), out| {
                    write_string(key, options.ensure_ascii, out);
                    out.push_str(&options.key_separator);
                    write_value(item, options, depth + 1, out)
                },
            )?;
        }
        ValueKind::Undefined => return Err(not_serialisable("Undefined")),
        other => return Err(not_serialisable(other)),
    }
    Ok(())
}

/// Writes `[a, b]` / `{...}` with Python's layout: on one line without
/// indent; otherwise one item per line, and `[]`/`{}` when empty.
fn write_container<T>(
    out: &mut String,
    options: &DumpOptions,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut write_item: impl FnMut(&T, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, depth + 1);
        write_item(item, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Dict keys: Python converts str, int, float, bool and None keys to text.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number | ValueKind::Bool | ValueKind::None => {
            let mut text = String::new();
            write_value(key, &DumpOptions::default(), 0, &mut text)?;
            Ok(text)
        }
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

fn write_number(value: &Value, out: &mut String) -> Result<(), Error> {
    if value.is_integer() {
        // Integers print the same in Rust and Python at any width.
        out.push_str(&value.to_string());
        return Ok(());
    }
    let f = f64::try_from(value.clone())?;
    out.push_str(&python_float_repr(f));
    Ok(())
}

/// `repr(float)` in Python: the shortest digits that round-trip, in fixed
/// notation when the decimal exponent is in [-4, 16), else scientific with a
/// signed two-digit (at least) exponent; json writes NaN and infinities bare.
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n_digits = digits.len() as i32;
    // Position of the decimal point relative to the first digit.
    let point = exponent + 1;
    let body = if (-3..=16).contains(&point) {
        if point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else if point < n_digits {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        } else {
            format!("{digits}{}.0", "0".repeat((point - n_digits) as usize))
        }
    } else {
        let mantissa = if n_digits > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{exp_sign}{:02}", exponent.abs())
    };
    format!("{sign}{body}")
}

/// A JSON string literal with Python's escapes: `\"`, `\\`, `\n`, `\r`, `\t`,
/// `\b`, `\f`, other control characters as `\u00XX`; with `ensure_ascii`,
/// every non-ASCII character as `\uXXXX` (surrogate pairs above U+FFFF).
fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        // Expected strings are Python 3's repr() of the same floats.
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1e-7, "1e-07"),
            (1.5e-7, "1.5e-07"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e16, "1.2345e+16"),
            (1e100, "1e+100"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.30000000000000004, "0.30000000000000004"),
            (f64::INFINITY, "Infinity"),
        ];
        for (f, expected) in cases {
            assert_eq!(python_float_repr(f), expected, "repr of {f:e}");
        }
    }

    #[test]
    fn strings_escape_like_python() {
        let mut out = String::new();
        write_string("a\"b\\c\nd\te\u{1}f\u{7f}é😀\u{2028}", false, &mut out);
        assert_eq!(out, "\"a\\\"b\\\\c\\nd\\te\\u0001f\u{7f}é😀\u{2028}\"");
        let mut out = String::new();
        write_string("é😀\u{7f}<>&'", true, &mut out);
        assert_eq!(out, "\"\\u00e9\\ud83d\\ude00\\u007f<>&'\"");
    }
}
