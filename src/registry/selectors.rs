//! Label selectors (set-based, apimachinery's grammar) and field selectors (metadata.name, metadata.namespace, and
//! the fields a kind makes selectable).

use crate::error::ApiError;
use serde_json::Value;

#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

fn bad(sel: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: {why} (in selector {sel:?})"))
}

fn check_key(sel: &str, k: &str) -> Result<(), ApiError> {
    let errs = crate::validation::qualified_name(k);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(bad(sel, &format!("invalid label key {k:?}: {}", errs.join("; "))))
    }
}

fn check_value(sel: &str, v: &str) -> Result<(), ApiError> {
    let errs = crate::validation::label_value(v);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(bad(sel, &format!("invalid label value: {v:?}: {}", errs.join("; "))))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(sel: &str, rest: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner =
        rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(|| bad(sel, "found '', expected: '('"))?;
    let mut vals = Vec::new();
    for v in inner.split(',') {
        let v = v.trim();
        check_value(sel, v)?;
        vals.push(v.to_string());
    }
    Ok(vals)
}

impl LabelSelector {
    pub fn parse(sel: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        if sel.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top(sel) {
            let p = part.trim();
            if p.is_empty() {
                return Err(bad(sel, "found '', expected: identifier"));
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                let k = k.trim();
                check_key(sel, k)?;
                Requirement::NotExists(k.to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                let (k, v) = (k.trim(), v.trim());
                check_key(sel, k)?;
                check_value(sel, v)?;
                Requirement::NotEq(k.into(), v.into())
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                let (k, v) = (k.trim(), v.trim());
                check_key(sel, k)?;
                check_value(sel, v)?;
                Requirement::Eq(k.into(), v.into())
            } else if let Some(i) = p.find(" notin ").or_else(|| p.find(" notin(")) {
                let k = p[..i].trim();
                check_key(sel, k)?;
                Requirement::NotIn(k.into(), parse_set(sel, &p[i + 6..])?)
            } else if let Some(i) = p.find(" in ").or_else(|| p.find(" in(")) {
                let k = p[..i].trim();
                check_key(sel, k)?;
                Requirement::In(k.into(), parse_set(sel, &p[i + 3..])?)
            } else {
                if p.contains(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == '<' || c == '>') {
                    return Err(bad(sel, &format!("invalid requirement {p:?}")));
                }
                check_key(sel, p)?;
                Requirement::Exists(p.to_string())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A field selector over the fields every kind supports and those its kind makes selectable.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields of every kind: kube-apiserver's `ObjectMetaFieldsSet`.
const METADATA_FIELDS: [&str; 2] = ["metadata.name", "metadata.namespace"];

impl FieldSelector {
    /// `kind_labels`: the labels the kind adds to [`METADATA_FIELDS`]; any other is kube-apiserver's 400.
    pub fn parse(sel: &str, kind_labels: &[&str]) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        if sel.trim().is_empty() {
            return Ok(FieldSelector(out));
        }
        for part in sel.split(',') {
            let p = part.trim();
            let (field, eq, value) = if let Some((f, v)) = p.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{sel}'; can't understand '{p}'")));
            };
            let field = field.trim();
            if !METADATA_FIELDS.contains(&field) && !kind_labels.contains(&field) {
                return Err(ApiError::bad_request(format!("field label not supported: {field}")));
            }
            out.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `obj` has the fields selected; `kind_fields` gives the kind's selectable fields, asked for only when
    /// the selector names one of them.
    pub fn matches(&self, obj: &Value, kind_fields: impl FnOnce() -> Vec<(&'static str, String)>) -> bool {
        let mut kind_fields = Some(kind_fields);
        let mut fields: Vec<(&'static str, String)> = Vec::new();
        self.0.iter().all(|(f, eq, v)| {
            let actual = match f.as_str() {
                "metadata.name" => obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default(),
                "metadata.namespace" => obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default(),
                label => {
                    if let Some(get) = kind_fields.take() {
                        fields = get();
                    }
                    fields.iter().find(|(l, _)| *l == label).map(|(_, v)| v.as_str()).unwrap_or_default()
                }
            };
            (actual == v) == *eq
        })
    }

    /// The name an equality selector pins, letting a list or watch read one key instead of scanning.
    pub fn exact_name(&self) -> Option<&str> {
        self.0.iter().find(|(f, eq, _)| f == "metadata.name" && *eq).map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn set_based_selectors() {
        let l = json!({"env": "prod", "tier": "web"});
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(Some(&l));
        assert!(m("env=prod"));
        assert!(m("env==prod,tier"));
        assert!(!m("env!=prod"));
        assert!(m("env in (prod, dev)"));
        assert!(!m("env notin (prod)"));
        assert!(m("!missing"));
        assert!(!m("missing"));
        assert!(m("tier in (web),env notin (dev,qa)"));
        assert!(LabelSelector::parse("a b").is_err());
        assert!(LabelSelector::parse("env in prod").is_err());
        assert!(LabelSelector::parse("-bad=x").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = json!({"metadata": {"name": "a", "namespace": "ns"}});
        let none = Vec::new;
        assert!(FieldSelector::parse("metadata.name=a", &[]).unwrap().matches(&o, none));
        assert!(FieldSelector::parse("metadata.namespace!=x,metadata.name==a", &[]).unwrap().matches(&o, none));
        assert!(!FieldSelector::parse("metadata.name=b", &[]).unwrap().matches(&o, none));
        assert_eq!(FieldSelector::parse("metadata.name=a", &[]).unwrap().exact_name(), Some("a"));
        let e = FieldSelector::parse("spec.x=1", &[]).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (400, "field label not supported: spec.x"));
        // A kind's own labels, an empty value (kubectl describe's involvedObject.namespace= for cluster objects).
        let kind = FieldSelector::parse("spec.x=1,spec.y=", &["spec.x", "spec.y"]).unwrap();
        assert!(kind.matches(&o, || vec![("spec.x", "1".to_string()), ("spec.y", String::new())]));
        assert!(!kind.matches(&o, || vec![("spec.x", "2".to_string())]));
    }
}
