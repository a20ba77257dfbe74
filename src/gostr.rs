//! Go's rendering of strings, where kube-apiserver's messages show them: `strconv.Quote` (what `%q` prints, as in
//! `metadata.name: Invalid value: "x": ...` and `... "x" not found`) and `strings.ToLower`.

use std::fmt::Write;

/// `strconv.Quote` (what `%q` and `%#v` print for a string).
pub fn quote(s: &str) -> String {
    quote_bytes(s.as_bytes())
}

/// `strconv.Quote` of a Go string, which may hold bytes that are not UTF-8 (Go slices strings by byte, so an error
/// can quote half a character: each stray byte is written `\xNN`). Printable characters stand as they are,
/// others are escaped as Go escapes them: `\a \b \f \n \r \t \v`, `\xNN` below a space and for DEL, `\uNNNN` or
/// `\UNNNNNNNN` above.
pub fn quote_bytes(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len() + 2);
    out.push('"');
    for chunk in b.utf8_chunks() {
        for c in chunk.valid().chars() {
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
                c if is_print(c) => out.push(c),
                c if (c as u32) < 0x10000 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => {
                    let _ = write!(out, "\\U{:08x}", c as u32);
                }
            }
        }
        for byte in chunk.invalid() {
            let _ = write!(out, "\\x{byte:02x}");
        }
    }
    out.push('"');
    out
}

/// `strconv.IsPrint`: letters, marks, numbers, punctuation, symbols and the ASCII space; not controls (Cc),
/// format characters (Cf), private use (Co), noncharacters, nor spaces and separators other than U+0020 (Zs, Zl,
/// Zp). Code points Unicode has not assigned (Cn) would need Go's tables and pass as printable here.
pub fn is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    let u = c as u32;
    let format = matches!(
        u,
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    );
    let private_use = matches!(u, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let noncharacter = matches!(u, 0xFDD0..=0xFDEF) || (u & 0xFFFE) == 0xFFFE;
    !(c.is_control() || c.is_whitespace() || format || private_use || noncharacter)
}

/// `strings.ToLower`: Unicode's simple lowercase mapping, character by character. Rust's `str::to_lowercase` also
/// applies the special mappings (`İ` becomes `i` plus a combining dot, a final `Σ` becomes `ς`), so a parameter
/// name like `storagePolİcyName` would match in Go and not in Rust.
pub fn to_lower(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\u{130}' => out.push('i'),
            c => out.extend(c.to_lowercase()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Go's strconv quote_test.go (`TestQuote`'s table, its printable and escaped cases), and what it says of
    /// spaces and format characters.
    #[test]
    fn quotes_as_go() {
        let cases = [
            ("\x07\x08\x0c\r\n\t\x0b", r#""\a\b\f\r\n\t\v""#),
            ("\\", r#""\\""#),
            ("abc\u{ff}def", "\"abc\u{ff}def\""),
            ("\u{263a}", "\"\u{263a}\""),
            ("\u{10ffff}", r#""\U0010ffff""#),
            ("\x04", r#""\x04""#),
            ("\x7f", r#""\x7f""#),
            ("!\u{00a0}!\u{2000}!\u{3000}!", r#""!\u00a0!\u2000!\u3000!""#),
            ("\u{200b}\u{feff}\u{ad}", r#""\u200b\ufeff\u00ad""#),
            ("\u{85}", r#""\u0085""#),
            ("Tama-nui-te-rā.is.Māori.sun", "\"Tama-nui-te-rā.is.Māori.sun\""),
        ];
        for (s, want) in cases {
            assert_eq!(quote(s), want, "{s:?}");
        }
        assert_eq!(quote_bytes(b"a\xc3"), r#""a\xc3""#);
    }
}
