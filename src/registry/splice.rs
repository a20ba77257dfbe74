//! A stored object written for clients straight from its stored bytes, without building a `Value`: what makes a
//! large LIST cheap.

use super::decode;

/// The client's JSON of a stored object without parsing it into a `Value`: the stored bytes are a JSON object
/// (written by [`Resource::encode`]); its top-level members are copied as they are, apiVersion and kind replaced,
/// and metadata.resourceVersion added. `None` when the bytes are not such an object (or need unescaping to read
/// their keys); the caller then takes the parsed path.
pub fn splice_stored(stored: &[u8], revision: u64, api_version: &str, kind: &str) -> Option<Vec<u8>> {
    use serde_json::value::RawValue;
    use std::collections::BTreeMap;
    // Skipped values are not depth-checked by serde_json: what a read would refuse takes the reading path.
    if !decode::reads_within_depth(stored) {
        return None;
    }
    let top: BTreeMap<&str, &RawValue> = serde_json::from_slice(stored).ok()?;
    let mut out = Vec::with_capacity(stored.len() + 64);
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut out, api_version).ok()?;
    out.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut out, kind).ok()?;
    let mut has_metadata = false;
    for (key, value) in &top {
        if matches!(*key, "apiVersion" | "kind") {
            continue;
        }
        out.push(b',');
        serde_json::to_writer(&mut out, key).ok()?;
        out.push(b':');
        if *key == "metadata" {
            has_metadata = true;
            splice_metadata(&mut out, value.get(), revision)?;
        } else {
            out.extend_from_slice(value.get().as_bytes());
        }
    }
    if !has_metadata {
        out.extend_from_slice(b",\"metadata\":{\"resourceVersion\":");
        serde_json::to_writer(&mut out, &revision.to_string()).ok()?;
        out.push(b'}');
    }
    out.push(b'}');
    Some(out)
}

/// Writes an object's stored `metadata` (a JSON object) with `resourceVersion` set to `revision`. This server
/// stores metadata without one, so it is written in front of the stored fields as they are; metadata that may hold
/// one (or hides key names behind escapes) goes through a map. `None` when `metadata` is not an object.
pub fn splice_metadata(out: &mut Vec<u8>, metadata: &str, revision: u64) -> Option<()> {
    use std::io::Write;
    let inner = metadata.trim_start().strip_prefix('{')?.trim_start();
    if metadata.contains("\"resourceVersion\"") || metadata.contains("\\u") {
        use serde_json::value::RawValue;
        let mut meta: std::collections::BTreeMap<String, &RawValue> = serde_json::from_str(metadata).ok()?;
        let rv = serde_json::value::to_raw_value(&revision.to_string()).ok()?;
        meta.insert("resourceVersion".into(), &rv);
        return serde_json::to_writer(out, &meta).ok();
    }
    write!(out, "{{\"resourceVersion\":\"{revision}\"").ok()?;
    if !inner.starts_with('}') {
        out.push(b',');
    }
    out.extend_from_slice(inner.as_bytes());
    Some(())
}

#[cfg(test)]
mod splice_tests {
    use super::{splice_metadata, splice_stored};
    use serde_json::{json, Value};

    /// What the parsed path gives: the stored object with apiVersion, kind and resourceVersion set.
    fn parsed(stored: &Value, rv: u64, api_version: &str, kind: &str) -> Value {
        let mut o = stored.clone();
        o["apiVersion"] = json!(api_version);
        o["kind"] = json!(kind);
        if o.get("metadata").is_none() {
            o["metadata"] = json!({});
        }
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        o
    }

    #[test]
    fn splice_equals_the_parsed_path() {
        let cases = [
            json!({"apiVersion": "core.gardener.cloud/v1alpha1", "kind": "ShootState",
                "metadata": {"name": "a", "namespace": "n", "labels": {"x/y": "z\"q"}, "uid": "u"},
                "spec": {"gardener": [{"name": "ca", "data": {"k": "v\\n\u{e9}"}}]}}),
            json!({"apiVersion": "v", "kind": "K", "metadata": {}, "status": {"conditions": []}}),
            json!({"apiVersion": "v", "kind": "K", "spec": {}}),
            json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "b", "resourceVersion": "7"}}),
            json!({"apiVersion": "v", "kind": "K", "metadata": {"annotations": {"a": "x\u{1}y\"resourceVersion\""}}}),
        ];
        for stored in cases {
            let bytes = serde_json::to_vec(&stored).unwrap();
            let raw = splice_stored(&bytes, 42, "core.gardener.cloud/v1beta1", "ShootState").expect("spliced");
            assert_eq!(raw.windows(17).filter(|w| w == b"\"resourceVersion\"").count(), 1, "one resourceVersion");
            let got: Value = serde_json::from_slice(&raw).expect("valid JSON");
            assert_eq!(got, parsed(&stored, 42, "core.gardener.cloud/v1beta1", "ShootState"), "{stored}");
        }
    }

    #[test]
    fn metadata_splices_keep_every_field() {
        let splice = |m: &str| {
            let mut out = Vec::new();
            splice_metadata(&mut out, m, 9).map(|()| serde_json::from_slice::<Value>(&out).expect("valid JSON"))
        };
        assert_eq!(splice("{}"), Some(json!({"resourceVersion": "9"})));
        assert_eq!(splice(" { } "), Some(json!({"resourceVersion": "9"})));
        assert_eq!(splice(r#"{"name":"a","uid":"u"}"#), Some(json!({"name": "a", "uid": "u", "resourceVersion": "9"})));
        assert_eq!(splice(r#"{"resourceVersion":"3","name":"a"}"#), Some(json!({"name": "a", "resourceVersion": "9"})));
        assert_eq!(splice(r#"{"resource\u0056ersion":"3"}"#), Some(json!({"resourceVersion": "9"})));
        assert_eq!(splice("null"), None);
        assert_eq!(splice("[1]"), None);
    }

    #[test]
    fn splice_declines_what_it_cannot_borrow() {
        assert!(splice_stored(b"[1,2]", 1, "v", "K").is_none());
        assert!(splice_stored(b"{\"a\\u0062\":1}", 1, "v", "K").is_none(), "escaped keys go the parsed way");
        assert!(splice_stored(b"{\"metadata\":", 1, "v", "K").is_none());
        assert!(splice_stored(b"", 1, "v", "K").is_none());
    }
}
