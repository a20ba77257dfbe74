//! The JSON Patch of mutating admission: what defaulting added to an object, as operations on the object as sent.
//!
//! The kind's typed decode gives the object before its defaults (`before`) and after them (`after`), both as
//! canonical JSON; `json_patch::diff` says what changed. Only what defaulting *added* is kept: a value where
//! `before` has none (absent, null, "" or []), inside objects or lists of the same length; set values and the
//! items of a list are never replaced. What the typed round trip merely normalizes (unknown fields dropped, empty
//! fields omitted, number forms) is in `before` and `after` alike, so it is no default and is left as sent:
//! kube-apiserver prunes and normalizes CRD objects itself, and a patch must not fight it (reinvocation would loop).
//!
//! The operations are then placed on the object as sent, which may lack a container that the typed decode made up
//! (a struct field with a default, absent or null in the text): the operation then fills that container whole.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, ReplaceOperation};
use serde_json::Value;

/// The JSON Patch that adds to `sent` what defaulting added to `before` to make `after`; `None` when nothing is
/// added.
pub fn default_patch(sent: &Value, before: &Value, after: &Value) -> Option<Patch> {
    let mut targets: Vec<Vec<String>> = json_patch::diff(before, after)
        .0
        .iter()
        .filter(|op| matches!(op, PatchOperation::Add(_) | PatchOperation::Replace(_)))
        .filter_map(|op| added_at(before, op.path().tokens().map(|t| t.decoded().into_owned()).collect()))
        .filter_map(|tokens| in_sent(sent, tokens))
        .collect();
    // One operation per filled value: those inside it are dropped.
    targets.sort();
    targets.dedup_by(|later, kept| later.starts_with(kept));
    let ops: Vec<PatchOperation> = targets
        .into_iter()
        .map(|tokens| {
            let value = get(after, &tokens).cloned().unwrap_or(Value::Null);
            let replace = get(sent, &tokens).is_some();
            let path = PointerBuf::from_tokens(&tokens);
            match replace {
                true => PatchOperation::Replace(ReplaceOperation { path, value }),
                false => PatchOperation::Add(AddOperation { path, value }),
            }
        })
        .collect();
    (!ops.is_empty()).then_some(Patch(ops))
}

/// Where a change at `tokens` adds a value: the shallowest point on its path where `before` has none. `None` when
/// it has one all the way (the change replaces a set value) or the point is a new item of a list.
fn added_at(before: &Value, tokens: Vec<String>) -> Option<Vec<String>> {
    let mut at = before;
    for (i, token) in tokens.iter().enumerate() {
        match child(at, token) {
            Some(v) if !is_unset(v) => at = v,
            Some(_) => return Some(tokens[..=i].to_vec()),
            None if at.is_array() => return None,
            None => return Some(tokens[..=i].to_vec()),
        }
    }
    None
}

/// The same place in the object as sent: `tokens` when its container is there, else the first container on the
/// way that is missing (or not a container), to be filled whole. `None` when a list in the text is too short for
/// the index (the typed decode keeps every item, so the text is not what was decoded).
fn in_sent(sent: &Value, tokens: Vec<String>) -> Option<Vec<String>> {
    let mut at = sent;
    for (i, token) in tokens[..tokens.len().saturating_sub(1)].iter().enumerate() {
        match child(at, token) {
            Some(v) if v.is_object() || v.is_array() => at = v,
            None if at.is_array() => return None,
            _ => return Some(tokens[..=i].to_vec()),
        }
    }
    if let (Value::Array(items), Some(last)) = (at, tokens.last()) {
        if last.parse::<usize>().map_or(true, |i| i > items.len()) {
            return None;
        }
    }
    Some(tokens)
}

fn child<'v>(v: &'v Value, token: &str) -> Option<&'v Value> {
    match v {
        Value::Object(m) => m.get(token),
        Value::Array(a) => token.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => None,
    }
}

fn get<'v>(v: &'v Value, tokens: &[String]) -> Option<&'v Value> {
    tokens.iter().try_fold(v, |at, t| child(at, t))
}

/// A value that counts as not set: null, "" or [].
fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patch(sent: Value, before: Value, after: Value) -> Value {
        serde_json::to_value(default_patch(&sent, &before, &after)).unwrap()
    }

    #[test]
    fn adds_what_defaulting_added_and_nothing_else() {
        // A field added to an object that is there.
        assert_eq!(
            patch(json!({"spec": {"a": 1}}), json!({"spec": {"a": 1}}), json!({"spec": {"a": 1, "b": 2}})),
            json!([{"op": "add", "path": "/spec/b", "value": 2}])
        );
        // An unset value ("" or [] or null) is replaced; a set one is not; an item is not added to a set list.
        assert_eq!(
            patch(
                json!({"s": "", "l": [], "n": null}),
                json!({"s": "", "l": [], "n": null}),
                json!({"s": "x", "l": ["y"], "n": 1})
            ),
            json!([{"op": "replace", "path": "/l", "value": ["y"]}, {"op": "replace", "path": "/n", "value": 1},
                   {"op": "replace", "path": "/s", "value": "x"}])
        );
        assert_eq!(patch(json!({"s": "a"}), json!({"s": "a"}), json!({"s": "b"})), Value::Null);
        assert_eq!(patch(json!({"l": [1]}), json!({"l": [1]}), json!({"l": [1, 2]})), Value::Null);
        // A field inside an item of a list is added.
        assert_eq!(
            patch(json!({"l": [{}]}), json!({"l": [{}]}), json!({"l": [{"d": 1}]})),
            json!([{"op": "add", "path": "/l/0/d", "value": 1}])
        );
        // Nothing removed: a field the decode dropped stays as sent.
        assert_eq!(patch(json!({"x": 1}), json!({}), json!({})), Value::Null);
    }

    #[test]
    fn fills_a_container_the_text_lacks() {
        // The decode made up `spec` (null or absent in the text): the operation fills it whole.
        let (before, after) = (json!({"spec": {}}), json!({"spec": {"a": {"b": 1}}}));
        assert_eq!(
            patch(json!({"spec": null}), before.clone(), after.clone()),
            json!([{"op": "replace", "path": "/spec", "value": {"a": {"b": 1}}}])
        );
        assert_eq!(
            patch(json!({}), before, after.clone()),
            json!([{"op": "add", "path": "/spec", "value": {"a": {"b": 1}}}])
        );
        // Keys with / and ~ are escaped in the path.
        assert_eq!(
            patch(json!({"m": {}}), json!({"m": {}}), json!({"m": {"a/b~c": 1}})),
            json!([{"op": "add", "path": "/m/a~1b~0c", "value": 1}])
        );
    }
}
