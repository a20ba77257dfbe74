//! How Go renders values inside the library's error messages (`%q`, `strconv` errors, a `sets.String`) and the Go
//! standard library functions whose exact behaviour the plugins depend on (`strings.ToLower`, `url.Parse`), so that
//! our results and messages read exactly like csi-translation-lib's.

use super::{Result, TranslationError};
use std::collections::BTreeSet;

pub use crate::gostr::{quote, quote_bytes, to_lower};

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

/// Where `unescape` runs, as Go's `url.encoding` modes (they differ in which bytes may stand unescaped).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Host,
    Zone,
    Other,
}

/// The path of `raw`, a URL with a scheme and `//` (the caller checked that), as Go's `url.Parse` gives it, or Go's
/// error: `parse "<url>": <reason>`. Only the checks such a URL passes through are here: control characters, the
/// authority (userinfo, host, port, a bracketed IP literal) and the escapes of every part.
pub fn url_path(raw: &str) -> Result<String> {
    let fail = |url: &str, reason: UrlError| TranslationError::new(format!("parse {}: {reason}", quote(url)));
    // Go cuts the fragment off first and names the URL without it, unless the fragment itself is the problem.
    let (url, fragment) = raw.split_once('#').map_or((raw, ""), |(u, f)| (u, f));
    let path = parse_authority_and_path(url).map_err(|r| fail(url, r))?;
    if !fragment.is_empty() {
        unescape(fragment.as_bytes(), Part::Other).map_err(|r| fail(raw, r))?;
    }
    Ok(String::from_utf8_lossy(&path).into_owned())
}

/// Go's `url.Parse` reasons, as it writes them; the caller prefixes the URL. Quoted parts are already `%q`-quoted.
#[derive(Debug, thiserror::Error)]
enum UrlError {
    #[error("net/url: invalid control character in URL")]
    ControlCharacter,
    #[error("net/url: invalid userinfo")]
    Userinfo,
    #[error("invalid IP-literal")]
    IpLiteral,
    #[error("missing ']' in host")]
    MissingBracket,
    #[error("invalid port {0} after host")]
    Port(String),
    #[error("invalid host: ParseAddr({0}): unable to parse IP")]
    Addr(String),
    #[error("invalid URL escape {0}")]
    Escape(String),
    #[error("invalid character {0} in host name")]
    HostCharacter(String),
}

type Reason = std::result::Result<Vec<u8>, UrlError>;

fn parse_authority_and_path(url: &str) -> Reason {
    if url.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(UrlError::ControlCharacter);
    }
    let rest = url.split_once("://").map_or("", |(_, r)| r);
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let (userinfo, host) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    parse_host(host.as_bytes())?;
    if let Some(userinfo) = userinfo {
        if !userinfo.chars().all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c)) {
            return Err(UrlError::Userinfo);
        }
        let (user, password) = userinfo.split_once(':').map_or((userinfo, ""), |(u, p)| (u, p));
        unescape(user.as_bytes(), Part::Other)?;
        unescape(password.as_bytes(), Part::Other)?;
    }
    unescape(path.as_bytes(), Part::Other)
}

/// `url.parseHost` for a scheme other than http(s): the port follows the last colon; a host starting with `[` is an
/// IPv6 literal (with an optional `%25` zone); `%` escapes only non-ASCII bytes.
fn parse_host(host: &[u8]) -> std::result::Result<(), UrlError> {
    let invalid_port = |p: &[u8]| Err(UrlError::Port(quote_bytes(p)));
    match host.iter().rposition(|&b| b == b'[') {
        Some(i) if i > 0 => return Err(UrlError::IpLiteral),
        Some(_) => {
            let Some(close) = host.iter().rposition(|&b| b == b']') else {
                return Err(UrlError::MissingBracket);
            };
            let port = &host[close + 1..];
            if !valid_optional_port(port) {
                return invalid_port(port);
            }
            let name = &host[1..close];
            let unescaped = match name.windows(3).position(|w| w == b"%25") {
                Some(z) => [unescape(&name[..z], Part::Host)?, unescape(&name[z..], Part::Zone)?].concat(),
                None => unescape(name, Part::Host)?,
            };
            return ip_literal(&unescaped);
        }
        None => {}
    }
    if let Some(i) = host.iter().rposition(|&b| b == b':') {
        if !valid_optional_port(&host[i..]) {
            return invalid_port(&host[i..]);
        }
    }
    unescape(host, Part::Host).map(|_| ())
}

/// Only an IPv6 address may stand in brackets. Go reports other text with `netip.ParseAddr`'s reason; ours is its
/// reason for text that is no IP at all, whatever the text (see docs/reference/differences.md).
fn ip_literal(unescaped: &[u8]) -> std::result::Result<(), UrlError> {
    let text = String::from_utf8_lossy(unescaped);
    let (addr, zone) = text.split_once('%').map_or((&*text, None), |(a, z)| (a, Some(z)));
    if zone.is_none() && addr.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(UrlError::IpLiteral);
    }
    if addr.parse::<std::net::Ipv6Addr>().is_ok() && zone != Some("") {
        return Ok(());
    }
    Err(UrlError::Addr(quote_bytes(unescaped)))
}

/// `validOptionalPort`: empty, or a colon and digits.
fn valid_optional_port(port: &[u8]) -> bool {
    match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    }
}

/// `shouldEscape` in a host or zone: what may not stand there unescaped.
fn escaped_in_host(b: u8) -> bool {
    !(b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&b))
}

/// `url.unescape`: `%XX` decoded; a malformed escape, an escaped ASCII byte in a host (but `%25`), an escaped byte
/// that could not stand unescaped in a zone, and a raw byte that may not stand in a host or zone are errors.
fn unescape(s: &[u8], part: Part) -> Reason {
    let escape_error = |e: &[u8]| UrlError::Escape(quote_bytes(e));
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let b = s[i];
        if b == b'%' {
            if i + 2 >= s.len() || !s[i + 1].is_ascii_hexdigit() || !s[i + 2].is_ascii_hexdigit() {
                return Err(escape_error(&s[i..(i + 3).min(s.len())]));
            }
            let escape = &s[i..i + 3];
            let hex = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            let value = (hex(s[i + 1]) << 4) | hex(s[i + 2]);
            let percent = escape == b"%25";
            if part == Part::Host && hex(s[i + 1]) < 8 && !percent {
                return Err(escape_error(escape));
            }
            if part == Part::Zone && !percent && value != b' ' && escaped_in_host(value) {
                return Err(escape_error(escape));
            }
            out.push(value);
            i += 3;
        } else {
            if part != Part::Other && b < 0x80 && escaped_in_host(b) {
                return Err(UrlError::HostCharacter(quote_bytes(&[b])));
            }
            out.push(b);
            i += 1;
        }
    }
    Ok(out)
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
        assert_eq!(quote_bytes(b"%z\xc3"), r#""%z\xc3""#);
        assert_eq!(to_lower("FsType \u{130}\u{3a3}"), "fstype i\u{3c3}");
    }

    #[test]
    fn urls_parse_like_go() {
        let path = |s: &str| url_path(s).unwrap();
        let err = |s: &str| url_path(s).unwrap_err().0;
        assert_eq!(path("aws://z/vol-%41"), "/vol-A");
        assert_eq!(path("aws://user:p%40ss@z:8080/vol-1?x=%zz#frag"), "/vol-1");
        assert_eq!(path("aws://[fe80::1%25eth0]:1/vol-1"), "/vol-1");
        assert_eq!(path("aws://a:1:2/vol-1"), "/vol-1", "the port follows the last colon (not http)");
        assert_eq!(path("aws://z%c3%a9/vol-1"), "/vol-1", "non-ASCII bytes may be escaped in a host");
        assert_eq!(path("aws://z/vol-1#\u{1}"), "/vol-1", "control characters are checked before the fragment");
        let cases = [
            ("aws://z/vol-%zz", r#"parse "aws://z/vol-%zz": invalid URL escape "%zz""#),
            ("aws://z/vol-%zé", r#"parse "aws://z/vol-%zé": invalid URL escape "%z\xc3""#),
            ("aws://z/vol-1%", r#"parse "aws://z/vol-1%": invalid URL escape "%""#),
            ("aws://z/vol-1#%zz", r#"parse "aws://z/vol-1#%zz": invalid URL escape "%zz""#),
            ("aws://z/vol-%zz#f", r#"parse "aws://z/vol-%zz": invalid URL escape "%zz""#),
            ("aws://z:x/vol-1", r#"parse "aws://z:x/vol-1": invalid port ":x" after host"#),
            ("aws://z z/vol-1", r#"parse "aws://z z/vol-1": invalid character " " in host name"#),
            ("aws://z%41/vol-1", r#"parse "aws://z%41/vol-1": invalid URL escape "%41""#),
            ("aws://z\u{1}/vol-1", r#"parse "aws://z\x01/vol-1": net/url: invalid control character in URL"#),
            ("aws://ué@z/vol-1", r#"parse "aws://ué@z/vol-1": net/url: invalid userinfo"#),
            ("aws://u%zz@z/vol-1", r#"parse "aws://u%zz@z/vol-1": invalid URL escape "%zz""#),
            ("aws://[::1/vol-1", r#"parse "aws://[::1/vol-1": missing ']' in host"#),
            ("aws://[::1]x/vol-1", r#"parse "aws://[::1]x/vol-1": invalid port "x" after host"#),
            ("aws://a[::1]/vol-1", r#"parse "aws://a[::1]/vol-1": invalid IP-literal"#),
            ("aws://[1.2.3.4]/vol-1", r#"parse "aws://[1.2.3.4]/vol-1": invalid IP-literal"#),
            (
                "aws://[zone]/vol-1",
                r#"parse "aws://[zone]/vol-1": invalid host: ParseAddr("zone"): unable to parse IP"#,
            ),
            ("aws://[fe80::1%25%0a]/v", r#"parse "aws://[fe80::1%25%0a]/v": invalid URL escape "%0a""#),
        ];
        for (url, want) in cases {
            assert_eq!(err(url), want, "{url}");
        }
    }
}
