//! JSON patches (RFC 6902) applied one operation at a time, each checked against the nesting limit first.

use super::decode;
use serde_json::Value;

pub(super) enum JsonPatchError {
    /// The operation would nest the object too deeply: the path of the value that is too deep.
    TooDeep(String),
    /// An operation failed (as json_patch words it, with the operation's index in the whole patch).
    Failed(String),
}

/// Applies a JSON patch one operation at a time, refusing an operation that would nest the object deeper than it
/// may be stored before it is applied: each operation can add a value at the depth its path names, so checking
/// only the result would let a long patch build an object deep enough to exhaust the stack of whatever walks it.
pub(super) fn apply_json_patch(doc: &mut Value, patch: &json_patch::Patch) -> Result<(), JsonPatchError> {
    use json_patch::PatchOperation as Op;
    for (index, op) in patch.0.iter().enumerate() {
        let added = match op {
            Op::Add(o) => Some(&o.value),
            Op::Replace(o) => Some(&o.value),
            Op::Copy(o) => doc.pointer(o.from.as_str()),
            Op::Move(o) => doc.pointer(o.from.as_str()),
            Op::Remove(_) | Op::Test(_) => None,
        };
        if let Some(value) = added {
            let depth = op.path().as_str().matches('/').count();
            if let Some(inner) = decode::too_deep_at(value, depth + 1) {
                let path = field_path(doc, op.path());
                let sep = if path.is_empty() || inner.is_empty() || inner.starts_with('[') { "" } else { "." };
                return Err(JsonPatchError::TooDeep(format!("{path}{sep}{inner}")));
            }
        }
        json_patch::patch(doc, std::slice::from_ref(op)).map_err(|e| {
            JsonPatchError::Failed(format!("operation '/{index}' failed at path '{}': {}", e.path, e.kind))
        })?;
    }
    Ok(())
}

/// A JSON pointer into `doc` as a field path (`/spec/list/0/a` -> `spec.list[0].a`): a segment is an index where
/// `doc` has a list there (or the pointer goes past what `doc` has and the segment is a number or `-`).
fn field_path(doc: &Value, pointer: &json_patch::jsonptr::Pointer) -> String {
    let mut path = String::new();
    let mut at = Some(doc);
    for token in pointer.tokens() {
        let segment = token.decoded();
        let index = match at {
            Some(Value::Array(_)) => true,
            Some(_) => false,
            None => segment == "-" || segment.parse::<usize>().is_ok(),
        };
        match (index, path.is_empty()) {
            (true, _) => path.push_str(&format!("[{segment}]")),
            (false, true) => path.push_str(&segment),
            (false, false) => path.push_str(&format!(".{segment}")),
        }
        at = at.and_then(|v| match v {
            Value::Array(a) => segment.parse::<usize>().ok().and_then(|i| a.get(i)),
            Value::Object(m) => m.get(segment.as_ref()),
            _ => None,
        });
    }
    path
}
