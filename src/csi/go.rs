//! How Go renders values inside the library's error messages (`%q`, `strconv` errors, a `sets.String`), so that our
//! messages read exactly like csi-translation-lib's.

use super::{Result, TranslationError};
use std::collections::BTreeSet;
use std::fmt::Write;

/// `strconv.Quote` (what `%q` and `%#v` print for a string).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `strconv.Atoi` on a 64-bit platform, with its error text.
pub fn atoi(s: &str) -> Result<i64> {
    let syntax = || TranslationError::new(format!("strconv.Atoi: parsing {}: invalid syntax", quote(s)));
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(syntax());
    }
    s.parse::<i64>()
        .map_err(|_| TranslationError::new(format!("strconv.Atoi: parsing {}: value out of range", quote(s))))
}

/// Go's `%v` of a `sets.String` (a map with empty struct values, keys sorted).
pub fn string_set(set: &BTreeSet<String>) -> String {
    let items: Vec<String> = set.iter().map(|k| format!("{k}:{{}}")).collect();
    format!("map[{}]", items.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go() {
        assert_eq!(quote("a\"b\n"), r#""a\"b\n""#);
        assert_eq!(atoi("12"), Ok(12));
        assert_eq!(atoi("+3"), Ok(3));
        assert_eq!(atoi("x1").unwrap_err().to_string(), r#"strconv.Atoi: parsing "x1": invalid syntax"#);
        assert_eq!(atoi("").unwrap_err().to_string(), r#"strconv.Atoi: parsing "": invalid syntax"#);
        assert_eq!(
            atoi("99999999999999999999").unwrap_err().to_string(),
            r#"strconv.Atoi: parsing "99999999999999999999": value out of range"#
        );
        let set: BTreeSet<String> = ["us-east1".to_string(), "europe-west1".to_string()].into();
        assert_eq!(string_set(&set), "map[europe-west1:{} us-east1:{}]");
    }
}
