//! Durations as Go's `time.ParseDuration` reads them (`300ms`, `1.5h`, `2h45m`, `1m30s`), so that flags read as
//! kube-apiserver's do. A bare number other than `0` has no unit and is refused, as in Go. Leaf module: no crate
//! dependencies.

use std::time::Duration;

/// Why a duration does not parse, worded as Go's errors are.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("time: invalid duration {0:?}")]
    Invalid(String),
    #[error("time: missing unit in duration {0:?} (use e.g. 10s, 500ms, 1m30s)")]
    MissingUnit(String),
    #[error("time: unknown unit {unit:?} in duration {text:?} (use ns, us, ms, s, m or h)")]
    UnknownUnit { unit: String, text: String },
    #[error("invalid duration {0:?}: must not be negative")]
    Negative(String),
}

/// Nanoseconds per unit.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Go's `time.ParseDuration`, refusing negative durations (no flag of ours takes one).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(text.to_string());
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    // Go keeps the total in a uint64 and refuses anything past 1<<63 nanoseconds.
    const LIMIT: u64 = 1 << 63;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        // The integer part.
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let whole: u64 = match digits {
            0 => 0,
            _ => rest[..digits].parse().ok().filter(|v| *v <= LIMIT).ok_or_else(invalid)?,
        };
        rest = &rest[digits..];
        // The fraction: digits past what a uint64 holds are dropped, as Go drops them.
        let (mut fraction, mut scale, mut fraction_digits) = (0u64, 1f64, 0);
        if let Some(after_dot) = rest.strip_prefix('.') {
            rest = after_dot;
            let mut overflowed = false;
            for b in rest.bytes().take_while(u8::is_ascii_digit) {
                fraction_digits += 1;
                if overflowed {
                    continue;
                }
                match fraction.checked_mul(10).and_then(|f| f.checked_add(u64::from(b - b'0'))) {
                    Some(f) if f <= LIMIT => {
                        fraction = f;
                        scale *= 10.0;
                    }
                    _ => overflowed = true,
                }
            }
            rest = &rest[fraction_digits..];
        }
        if digits == 0 && fraction_digits == 0 {
            return Err(invalid()); // no digits at all, e.g. ".s"
        }
        let unit_len = rest.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(rest.len());
        if unit_len == 0 {
            return Err(DurationError::MissingUnit(text.to_string()));
        }
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let nanos = unit_nanos(unit)
            .ok_or_else(|| DurationError::UnknownUnit { unit: unit.to_string(), text: text.to_string() })?;
        let mut part = whole.checked_mul(nanos).filter(|v| *v <= LIMIT).ok_or_else(invalid)?;
        if fraction > 0 {
            part = part.checked_add((fraction as f64 * (nanos as f64 / scale)) as u64).ok_or_else(invalid)?;
        }
        total = total.checked_add(part).filter(|v| *v <= LIMIT).ok_or_else(invalid)?;
    }
    if total == LIMIT && !negative {
        return Err(invalid()); // one past the largest int64
    }
    if negative && total > 0 {
        return Err(DurationError::Negative(text.to_string()));
    }
    Ok(Duration::from_nanos(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: u64 = 1;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;

    /// Cases re-expressed from Go's own table for time.ParseDuration (src/time/time_test.go, parseDurationTests,
    /// as of Go 1.23), less the negative ones, which our flags refuse.
    #[test]
    fn parses_as_go_does() {
        let cases: &[(&str, u64)] = &[
            ("0", 0),
            ("5s", 5 * S),
            ("30s", 30 * S),
            ("1478s", 1478 * S),
            ("+5s", 5 * S),
            ("-0", 0),
            ("+0", 0),
            ("5.0s", 5 * S),
            ("5.6s", 5 * S + 600 * MS),
            ("5.s", 5 * S),
            (".5s", 500 * MS),
            ("1.0s", S),
            ("1.00s", S),
            ("1.004s", S + 4 * MS),
            ("1.0040s", S + 4 * MS),
            ("100.00100s", 100 * S + MS),
            ("10ns", 10 * NS),
            ("11us", 11 * US),
            ("12\u{b5}s", 12 * US),
            ("12\u{3bc}s", 12 * US),
            ("13ms", 13 * MS),
            ("14s", 14 * S),
            ("15m", 15 * M),
            ("16h", 16 * H),
            ("3h30m", 3 * H + 30 * M),
            ("10.5s4m", 4 * M + 10 * S + 500 * MS),
            ("1h2m3s4ms5us6ns", H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
            ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
            ("52763797000ns", 52763797000 * NS),
            ("0.3333333333333333333h", 20 * M),
            ("9007199254740993ns", (1 << 53) + 1),
            ("9223372036854775807ns", (1 << 63) - 1),
            ("9223372036854775.807us", (1 << 63) - 1),
            ("9223372036s854ms775us807ns", (1 << 63) - 1),
            ("0.100000000000000000000h", 6 * M),
            ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
        ];
        for (text, nanos) in cases {
            assert_eq!(parse_duration(text), Ok(Duration::from_nanos(*nanos)), "{text}");
        }
    }

    #[test]
    fn refuses_what_go_refuses() {
        for text in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{85}\u{85}",
            "hello \u{ffff} world",
            "9223372036854775810ns",
            "9223372036854775808ns",
            "9223372036854776us",
            "3000000h",
            "9223372036854775.808us",
            "9223372036854ms775us808ns",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} parsed");
        }
        assert_eq!(
            parse_duration("10").unwrap_err().to_string(),
            "time: missing unit in duration \"10\" (use e.g. 10s, 500ms, 1m30s)"
        );
        assert!(matches!(parse_duration("1d"), Err(DurationError::UnknownUnit { .. })));
        assert_eq!(parse_duration("-5s"), Err(DurationError::Negative("-5s".into())));
    }
}
