//! Upstream as the oracle: the same request sent to this server and to a real kube-apiserver, and their whole answers
//! compared (status code, the body minus the fields each server sets for itself, and the Warning headers). Every
//! difference must be one that docs/reference/differences.md lists in its table "What the oracle tests know" (the
//! table is read from the file), and every row of that table must still be seen, so that the list stays true.

use super::requests::Resp;
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// One answer, as far as it is compared.
#[derive(Debug, Clone)]
pub struct Answer {
    pub code: u16,
    pub body: Value,
    pub warnings: Vec<String>,
}

impl Answer {
    pub fn of(resp: &Resp) -> Answer {
        let body = serde_json::from_slice(&resp.body).unwrap_or_else(|_| Value::String(resp.text()));
        Answer { code: resp.status, body: without_server_set(body), warnings: resp.header_all("warning") }
    }
}

/// The fields a server sets for itself, different on every server and every run: identity and times.
fn without_server_set(mut body: Value) -> Value {
    fn strip_meta(meta: &mut Map<String, Value>) {
        for field in ["uid", "resourceVersion", "creationTimestamp", "selfLink"] {
            meta.remove(field);
        }
        if let Some(Value::Array(fields)) = meta.get_mut("managedFields") {
            for f in fields.iter_mut().filter_map(Value::as_object_mut) {
                f.remove("time");
            }
        }
    }
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        strip_meta(meta);
    }
    if let Some(Value::Array(items)) = body.get_mut("items") {
        for item in items {
            if let Some(meta) = item.get_mut("metadata").and_then(Value::as_object_mut) {
                strip_meta(meta);
            }
        }
    }
    body
}

/// A difference: where (`code`, `warnings`, or `body.<path>`), and both values.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Difference {
    pub case: String,
    pub path: String,
    pub ours: String,
    pub theirs: String,
}

fn diff_values(case: &str, path: &str, ours: &Value, theirs: &Value, out: &mut Vec<Difference>) {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let null = Value::Null;
                diff_values(case, &format!("{path}.{k}"), a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null), out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_values(case, &format!("{path}[{i}]"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(Difference {
            case: case.to_string(),
            path: path.to_string(),
            ours: a.to_string(),
            theirs: b.to_string(),
        }),
        _ => {}
    }
}

/// Every difference between two answers to the same request.
pub fn compare(case: &str, ours: &Answer, theirs: &Answer) -> Vec<Difference> {
    let mut out = Vec::new();
    if ours.code != theirs.code {
        out.push(Difference {
            case: case.into(),
            path: "code".into(),
            ours: ours.code.to_string(),
            theirs: theirs.code.to_string(),
        });
    }
    if ours.warnings != theirs.warnings {
        out.push(Difference {
            case: case.into(),
            path: "warnings".into(),
            ours: format!("{:?}", ours.warnings),
            theirs: format!("{:?}", theirs.warnings),
        });
    }
    diff_values(case, "body", &ours.body, &theirs.body, &mut out);
    out
}

/// A row of the table "What the oracle tests know" in docs/reference/differences.md: the case (a prefix of case
/// names, `*` for every case), the path of the difference (a prefix too), and whether it occurs on every run
/// (`always`) or only under conditions the test does not control (`sometimes`, e.g. a slow request).
#[derive(Debug, Clone)]
pub struct Known {
    pub case: String,
    pub path: String,
    pub always: bool,
}

impl Known {
    fn matches(&self, d: &Difference) -> bool {
        (self.case == "*" || d.case.starts_with(&self.case)) && d.path.starts_with(&self.path)
    }
}

/// The rows of the table of known differences, for the cases whose names start with `scope` (one test's cases).
pub fn known_differences(scope: &str) -> Vec<Known> {
    let doc = std::fs::read_to_string(super::repo().join("docs/reference/differences.md")).expect("differences.md");
    let table = doc.split("## What the oracle tests know").nth(1).expect("the table's section");
    table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let unquote = |s: &str| s.trim_matches('`').to_string();
            Some(Known {
                case: unquote(cells.get(1)?),
                path: unquote(cells.get(2)?),
                always: *cells.get(3)? == "always",
            })
        })
        .filter(|k| k.case == "*" || k.case.starts_with(scope))
        .collect()
}

/// Fails with every difference that the table does not list, and every row of the table (of this scope) that no
/// difference matched.
pub fn assert_only_known(scope: &str, differences: &[Difference]) {
    let known = known_differences(scope);
    let unknown: Vec<&Difference> = differences.iter().filter(|d| !known.iter().any(|k| k.matches(d))).collect();
    let unseen: Vec<&Known> = known.iter().filter(|k| k.always && !differences.iter().any(|d| k.matches(d))).collect();
    assert!(
        unknown.is_empty() && unseen.is_empty(),
        "differences from kube-apiserver that docs/reference/differences.md does not list:\n{}\nrows of its table \
         that no longer occur:\n{:?}",
        unknown
            .iter()
            .map(|d| format!("  {} {}: ours {} / kube-apiserver {}", d.case, d.path, d.ours, d.theirs))
            .collect::<Vec<_>>()
            .join("\n"),
        unseen
    );
}
