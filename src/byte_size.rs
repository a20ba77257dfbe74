//! Sizes in bytes as Kubernetes quantities write them (`64Mi`, `1Gi`, `500M`, `1048576`), for the memory flags.
//! Leaf module: no crate dependencies.

/// Why a size flag's value is not a size; the text is what the flag was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("invalid size {0:?}: a whole number of bytes, optionally with a suffix Ki, Mi, Gi, Ti, k, M, G or T")]
    Suffix(String),
    #[error("invalid size {0:?}: expected a number such as 64Mi")]
    Number(String),
    #[error("invalid size {0:?}: too large")]
    TooLarge(String),
}

/// Parses a non-negative whole number of bytes with an optional binary (Ki, Mi, Gi, Ti) or decimal (k, M, G, T)
/// suffix.
pub fn parse_byte_size(text: &str) -> Result<usize, ByteSizeError> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(ByteSizeError::Suffix(text.to_owned())),
    };
    let n: u64 = number.parse().map_err(|_| ByteSizeError::Number(text.to_owned()))?;
    n.checked_mul(unit).and_then(|b| usize::try_from(b).ok()).ok_or_else(|| ByteSizeError::TooLarge(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::parse_byte_size;

    #[test]
    fn quantities() {
        for (text, want) in
            [("0", 0), ("1048576", 1 << 20), ("64Mi", 64 << 20), ("1Gi", 1 << 30), ("2Ki", 2048), ("500M", 500_000_000)]
        {
            assert_eq!(parse_byte_size(text), Ok(want), "{text}");
        }
        for bad in ["", "Mi", "-1", "1.5Gi", "64mb", "64 Mi", "99999999999999Ti"] {
            assert!(parse_byte_size(bad).is_err(), "{bad}");
        }
    }
}
