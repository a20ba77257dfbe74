//! The samples of a Prometheus text exposition, as kube-apiserver's `/metrics` writes them: what the observation of
//! its encryption config and KMS key ids reads.

use std::collections::BTreeMap;

/// The samples of the metric `name` in a Prometheus text exposition: their labels and value (lines of other
/// metrics, comments and unparsable values are skipped; an optional sample timestamp after the value is ignored).
pub fn samples<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (BTreeMap<String, String>, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.trim_start().strip_prefix('{')?;
        let (labels, value) = rest.split_once('}')?;
        let value = value.split_whitespace().next()?.parse::<f64>().ok()?;
        Some((parse_labels(labels), value))
    })
}

/// `a="x",b="y"` (values with Prometheus' escapes \\, \" and \n).
fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if name.is_empty() || chars.next() != Some('=') || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                c => value.push(c),
            }
        }
        out.insert(name.trim().to_string(), value);
    }
}
