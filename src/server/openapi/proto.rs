//! The protobuf form of the swagger 2.0 document (gnostic's `openapi.v2.Document`, which kube-apiserver serves as
//! `application/com.github.proto-openapi.spec.v2.v1.0+protobuf`). kubectl reads it for client-side validation, which
//! it does for every kind whose PATCH does not advertise `fieldValidation` — a create-only kind such as
//! CSITranslation — and fails without it. The document carries `swagger`, `info` and the definitions (what kubectl
//! reads); the paths are in the JSON form only.

use serde_json::Value;

/// Media types of the protobuf form (the deprecated spelling, which kubectl still sends, and the current one).
pub const MEDIA_TYPES: [&str; 2] = [
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
];

/// A protobuf message being written (proto3: default values are left out).
#[derive(Default)]
struct Message(Vec<u8>);

impl Message {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }
    fn bytes(&mut self, field: u32, b: &[u8]) {
        self.key(field, 2);
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn string(&mut self, field: u32, s: &str) {
        if !s.is_empty() {
            self.bytes(field, s.as_bytes());
        }
    }
    fn message(&mut self, field: u32, m: Message) {
        self.bytes(field, &m.0);
    }
    fn boolean(&mut self, field: u32, b: bool) {
        if b {
            self.key(field, 0);
            self.varint(1);
        }
    }
    fn int64(&mut self, field: u32, i: i64) {
        if i != 0 {
            self.key(field, 0);
            self.varint(i as u64);
        }
    }
    fn double(&mut self, field: u32, f: f64) {
        if f != 0.0 {
            self.key(field, 1);
            self.0.extend_from_slice(&f.to_le_bytes());
        }
    }
}

/// `Any` with the value as YAML (how gnostic carries defaults, enums, examples and extensions).
fn any(v: &Value) -> Message {
    let mut m = Message::default();
    m.string(2, &serde_yaml_ng::to_string(v).unwrap_or_default());
    m
}

fn named_any(name: &str, v: &Value) -> Message {
    let mut m = Message::default();
    m.string(1, name);
    m.message(2, any(v));
    m
}

/// `Schema`: the JSON Schema keywords swagger 2.0 has, `x-` extensions as vendor extensions.
fn schema(s: &Value) -> Message {
    let mut m = Message::default();
    let Some(o) = s.as_object() else { return m };
    scalar_keywords(&mut m, o);
    for r in o.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        m.string(19, r);
    }
    for e in o.get("enum").and_then(Value::as_array).into_iter().flatten() {
        m.message(20, any(e));
    }
    nested_schemas(&mut m, o);
    m.boolean(27, o.get("readOnly").and_then(Value::as_bool).unwrap_or_default());
    if let Some(e) = o.get("example") {
        m.message(30, any(e));
    }
    for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-")) {
        m.message(31, named_any(k, v));
    }
    m
}

/// A `Schema`'s fields 1 to 18: the keywords of one value each.
fn scalar_keywords(m: &mut Message, o: &serde_json::Map<String, Value>) {
    let str_of = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or_default();
    let num = |k: &str| o.get(k).and_then(Value::as_f64).unwrap_or_default();
    let int = |k: &str| o.get(k).and_then(Value::as_i64).unwrap_or_default();
    let flag = |k: &str| o.get(k).and_then(Value::as_bool).unwrap_or_default();
    m.string(1, str_of("$ref"));
    m.string(2, str_of("format"));
    m.string(3, str_of("title"));
    m.string(4, str_of("description"));
    if let Some(d) = o.get("default") {
        m.message(5, any(d));
    }
    m.double(6, num("multipleOf"));
    m.double(7, num("maximum"));
    m.boolean(8, flag("exclusiveMaximum"));
    m.double(9, num("minimum"));
    m.boolean(10, flag("exclusiveMinimum"));
    m.int64(11, int("maxLength"));
    m.int64(12, int("minLength"));
    m.string(13, str_of("pattern"));
    m.int64(14, int("maxItems"));
    m.int64(15, int("minItems"));
    m.boolean(16, flag("uniqueItems"));
    m.int64(17, int("maxProperties"));
    m.int64(18, int("minProperties"));
}

/// A `Schema`'s fields 21 to 25: additionalProperties, type, items, allOf and properties.
fn nested_schemas(m: &mut Message, o: &serde_json::Map<String, Value>) {
    match o.get("additionalProperties") {
        Some(Value::Bool(b)) => {
            let mut item = Message::default();
            item.key(2, 0);
            item.varint(u64::from(*b));
            m.message(21, item);
        }
        Some(v @ Value::Object(_)) => {
            let mut item = Message::default();
            item.message(1, schema(v));
            m.message(21, item);
        }
        _ => {}
    }
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() {
        let mut t = Message::default();
        for x in types {
            t.string(1, x);
        }
        m.message(22, t);
    }
    let items: Vec<&Value> = match o.get("items") {
        Some(Value::Array(a)) => a.iter().collect(),
        Some(v @ Value::Object(_)) => vec![v],
        _ => vec![],
    };
    if !items.is_empty() {
        let mut it = Message::default();
        for x in items {
            it.message(1, schema(x));
        }
        m.message(23, it);
    }
    for a in o.get("allOf").and_then(Value::as_array).into_iter().flatten() {
        m.message(24, schema(a));
    }
    if let Some(props) = o.get("properties").and_then(Value::as_object) {
        let mut p = Message::default();
        for (name, s) in props {
            let mut named = Message::default();
            named.string(1, name);
            named.message(2, schema(s));
            p.message(1, named);
        }
        m.message(25, p);
    }
}

/// The protobuf `Document` of a swagger 2.0 JSON document.
pub fn document(v2: &Value) -> Vec<u8> {
    let mut doc = Message::default();
    doc.string(1, v2["swagger"].as_str().unwrap_or("2.0"));
    let mut info = Message::default();
    info.string(1, v2["info"]["title"].as_str().unwrap_or_default());
    info.string(2, v2["info"]["version"].as_str().unwrap_or_default());
    doc.message(2, info);
    let mut defs = Message::default();
    for (name, s) in v2["definitions"].as_object().into_iter().flatten() {
        let mut named = Message::default();
        named.string(1, name);
        named.message(2, schema(s));
        defs.message(1, named);
    }
    doc.message(9, defs);
    doc.0
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn wire_format() {
        let doc = super::document(&json!({"swagger": "2.0", "info": {"title": "t", "version": "1"},
            "definitions": {"A": {"type": "object", "required": ["x"], "properties": {"x": {"type": "string"}},
                                  "x-kubernetes-group-version-kind": [{"group": "g", "kind": "A", "version": "v"}]}}}));
        // swagger = 1, info = 2 {title = 1, version = 2}
        assert_eq!(&doc[..13], b"\x0a\x032.0\x12\x06\x0a\x01t\x12\x011");
        // definitions = 9 { additional_properties = 1 { name = 1 "A", value = 2 Schema } }
        assert_eq!(doc[13], 9 << 3 | 2);
        let text = String::from_utf8_lossy(&doc);
        assert!(text.contains("x-kubernetes-group-version-kind") && text.contains("kind: A"), "{text}");
    }
}
