//! OpenAPI v3 (per group-version, with hash-addressed URLs) and v2 documents, generated from the Rust types of the
//! kinds. They carry `x-kubernetes-group-version-kind` so `kubectl explain` finds the schemas, and advertise exactly
//! the patch types served (no strategic merge, no apply) so `kubectl apply` chooses JSON merge patch.

use crate::registry::strategy::Strategy;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha512};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Kubernetes' schema habits: `$schema` dropped, and an optional reference (schemars' `anyOf [ref, null]`) written
/// as `allOf [ref]`, the form kube-openapi emits and `kubectl explain` follows.
fn strip_schema_keys(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("$schema");
            // Doc comments wrap lines; Kubernetes descriptions are paragraphs.
            if let Some(Value::String(d)) = m.get_mut("description") {
                *d = d
                    .split("\n\n")
                    .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
                    .collect::<Vec<_>>()
                    .join("\n\n");
            }
            if let Some(Value::Array(any)) = m.get("anyOf") {
                let is_null =
                    |x: &Value| x.get("enum") == Some(&json!([null])) || x.get("type") == Some(&json!("null"));
                if any.len() == 2 && any.iter().any(is_null) {
                    if let Some(other) = any.iter().find(|x| !is_null(x)).cloned() {
                        m.remove("anyOf");
                        match other {
                            Value::Object(o) if o.contains_key("$ref") => {
                                m.insert("allOf".into(), json!([Value::Object(o)]));
                            }
                            Value::Object(o) => {
                                for (k, x) in o {
                                    m.entry(k).or_insert(x);
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
            for (_, x) in m.iter_mut() {
                strip_schema_keys(x);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip_schema_keys),
        _ => {}
    }
}

fn rewrite_refs(v: &mut Value, from: &str, to: &str) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(r)) = m.get_mut("$ref") {
                if let Some(rest) = r.strip_prefix(from) {
                    *r = format!("{to}{rest}");
                }
            }
            m.remove("nullable");
            for (_, x) in m.iter_mut() {
                rewrite_refs(x, from, to);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rewrite_refs(x, from, to)),
        _ => {}
    }
}

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn list_name(kind_schema: &str) -> String {
    format!("{kind_schema}List")
}

/// Schemas for one group-version: each kind (apiVersion/kind properties, GVK extension) and its List.
fn schemas_for(kinds: &[&Arc<dyn Strategy>], group: &str, version: &str) -> Map<String, Value> {
    let mut out = Map::new();
    for k in kinds {
        let i = k.info();
        let (name, defs) = k.schemas();
        for (n, mut s) in defs {
            strip_schema_keys(&mut s);
            out.entry(n).or_insert(s);
        }
        let gvk = json!([{"group": group, "version": version, "kind": i.kind}]);
        if let Some(Value::Object(s)) = out.get_mut(&name) {
            let props = s.entry("properties").or_insert_with(|| json!({}));
            props["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources"});
            props["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"});
            s.insert("x-kubernetes-group-version-kind".into(), gvk);
        }
        if i.create_only {
            // Never listed: no List kind.
            continue;
        }
        out.insert(
            list_name(&name),
            json!({
                "description": format!("{} is a list of {}.", i.list_kind, i.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."},
                    "kind": {"type": "string", "description": "Kind is a string value representing the REST resource this object represents."},
                    "metadata": {"$ref": format!("#/components/schemas/{META}.ListMeta"), "description": "Standard list metadata."},
                    "items": {"type": "array", "items": {"$ref": format!("#/components/schemas/{name}")}, "description": format!("List of {}.", i.plural)},
                },
                "x-kubernetes-group-version-kind": [{"group": group, "version": version, "kind": i.list_kind}],
            }),
        );
    }
    out
}

fn param(name: &str, location: &str, description: &str, schema_type: &str) -> Value {
    json!({"name": name, "in": location, "description": description, "schema": {"type": schema_type, "uniqueItems": true}})
}

fn write_params() -> Vec<Value> {
    vec![
        param("dryRun", "query", "When present, indicates that modifications should not be persisted. Valid values are: - All: all dry run stages will be processed", "string"),
        param("fieldManager", "query", "fieldManager is a name associated with the actor or entity that is making these changes.", "string"),
        param("fieldValidation", "query", "fieldValidation instructs the server on how to handle objects in the request (POST/PUT/PATCH) containing unknown or duplicate fields. Valid values are: - Ignore - Warn (default) - Strict", "string"),
    ]
}

fn list_params() -> Vec<Value> {
    vec![
        param("allowWatchBookmarks", "query", "allowWatchBookmarks requests watch events with type \"BOOKMARK\".", "boolean"),
        param("continue", "query", "The continue option should be set when retrieving more results from the server.", "string"),
        param("fieldSelector", "query", "A selector to restrict the list of returned objects by their fields (metadata.name, metadata.namespace).", "string"),
        param("labelSelector", "query", "A selector to restrict the list of returned objects by their labels.", "string"),
        param("limit", "query", "limit is a maximum number of responses to return for a list call.", "integer"),
        param("resourceVersion", "query", "resourceVersion sets a constraint on what resource versions a request may be served from.", "string"),
        param("resourceVersionMatch", "query", "resourceVersionMatch determines how resourceVersion is applied to list calls.", "string"),
        param("sendInitialEvents", "query", "`sendInitialEvents=true` may be set together with `watch=true`.", "boolean"),
        param("timeoutSeconds", "query", "Timeout for the list/watch call.", "integer"),
        param("watch", "query", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.", "boolean"),
    ]
}

fn response(schema_ref: &str) -> Value {
    json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema_ref}")}}}, "description": "OK"})
}

fn op(action: &str, id: String, desc: String, gvk: &Value, ok: &str, params: Vec<Value>, body: Option<Value>) -> Value {
    let mut o = json!({
        "description": desc, "operationId": id, "tags": [gvk["group"].as_str().unwrap_or_default()],
        "parameters": params,
        "responses": {"200": response(ok), "401": {"description": "Unauthorized"}},
        "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
    });
    if action == "post" {
        o["responses"]["201"] = response(ok);
        o["responses"]["202"] = response(ok);
    }
    if let Some(b) = body {
        o["requestBody"] = b;
    }
    o
}

fn camel(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// The v3 document of one group-version.
pub fn v3_document(kinds: &[Arc<dyn Strategy>], group: &str, version: &str) -> Value {
    let selected: Vec<&Arc<dyn Strategy>> =
        kinds.iter().filter(|k| k.info().group == group && k.info().versions.contains(&version)).collect();
    let mut paths = Map::new();
    let gv_id = format!("{}{}", group.split('.').map(camel).collect::<String>(), camel(version));
    for k in &selected {
        let i = k.info();
        let (name, _) = k.schemas();
        let list = list_name(&name);
        let gvk = json!({"group": group, "version": version, "kind": i.kind});
        let ns_seg = if i.namespaced { "/namespaces/{namespace}" } else { "" };
        let base = format!("/apis/{group}/{version}{ns_seg}/{}", i.plural);
        let scope = if i.namespaced { "Namespaced" } else { "" };
        let body = |ct: &[&str]| {
            let mut content = Map::new();
            for c in ct {
                content.insert(c.to_string(), json!({"schema": {"$ref": format!("#/components/schemas/{name}")}}));
            }
            json!({"content": content, "required": true})
        };
        let patch_body = json!({"content": {
            "application/json-patch+json": {"schema": {"$ref": format!("#/components/schemas/{META}.Patch")}},
            "application/merge-patch+json": {"schema": {"$ref": format!("#/components/schemas/{META}.Patch")}},
        }, "required": true});
        let mut ns_params = vec![
            json!({"name": "name", "in": "path", "required": true, "description": format!("name of the {}", i.kind), "schema": {"type": "string", "uniqueItems": true}}),
        ];
        let mut coll_params = vec![];
        if i.namespaced {
            let nsp = json!({"name": "namespace", "in": "path", "required": true, "description": "object name and auth scope, such as for teams and projects", "schema": {"type": "string", "uniqueItems": true}});
            ns_params.push(nsp.clone());
            coll_params.push(nsp);
        }
        coll_params.push(param("pretty", "query", "If 'true', then the output is pretty printed.", "string"));
        ns_params.push(param("pretty", "query", "If 'true', then the output is pretty printed.", "string"));
        let k_ = i.kind;
        if i.create_only {
            // A virtual resource: only POST on the collection, as kube-apiserver documents TokenReview.
            paths.insert(
                base.clone(),
                json!({
                    "post": op("post", format!("create{gv_id}{scope}{k_}"), format!("create a {k_}"), &gvk, &name, write_params(), Some(body(&["application/json"]))),
                    "parameters": coll_params,
                }),
            );
            continue;
        }
        paths.insert(
            base.clone(),
            json!({
                "get": op("list", format!("list{gv_id}{scope}{k_}"), format!("list or watch objects of kind {k_}"), &gvk, &list, list_params(), None),
                "post": op("post", format!("create{gv_id}{scope}{k_}"), format!("create a {k_}"), &gvk, &name, write_params(), Some(body(&["application/json"]))),
                "delete": op("deletecollection", format!("deleteCollection{gv_id}{scope}{k_}"), format!("delete collection of {k_}"), &gvk, &format!("{META}.Status"), list_params(), None),
                "parameters": coll_params,
            }),
        );
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": op("get", format!("read{gv_id}{scope}{k_}"), format!("read the specified {k_}"), &gvk, &name, vec![], None),
                "put": op("put", format!("replace{gv_id}{scope}{k_}"), format!("replace the specified {k_}"), &gvk, &name, write_params(), Some(body(&["application/json"]))),
                "patch": op("patch", format!("patch{gv_id}{scope}{k_}"), format!("partially update the specified {k_}"), &gvk, &name, write_params(), Some(patch_body.clone())),
                "delete": op("delete", format!("delete{gv_id}{scope}{k_}"), format!("delete a {k_}"), &gvk, &format!("{META}.Status"), vec![param("dryRun", "query", "When present, indicates that modifications should not be persisted.", "string"), param("propagationPolicy", "query", "Whether and how garbage collection will be performed.", "string")], None),
                "parameters": ns_params.clone(),
            }),
        );
        if i.has_status {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({
                    "get": op("get", format!("read{gv_id}{scope}{k_}Status"), format!("read status of the specified {k_}"), &gvk, &name, vec![], None),
                    "put": op("put", format!("replace{gv_id}{scope}{k_}Status"), format!("replace status of the specified {k_}"), &gvk, &name, write_params(), Some(body(&["application/json"]))),
                    "patch": op("patch", format!("patch{gv_id}{scope}{k_}Status"), format!("partially update status of the specified {k_}"), &gvk, &name, write_params(), Some(patch_body)),
                    "parameters": ns_params,
                }),
            );
        }
        if i.namespaced {
            paths.insert(
                format!("/apis/{group}/{version}/{}", i.plural),
                json!({"get": op("list", format!("list{gv_id}{k_}ForAllNamespaces"), format!("list or watch objects of kind {k_}"), &gvk, &list, list_params(), None)}),
            );
        }
    }
    let mut schemas = schemas_for(&selected, group, version);
    schemas.insert(
        format!("{META}.Patch"),
        json!({"description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.", "type": "object"}),
    );
    json!({
        "openapi": "3.0.0",
        "info": {"title": "migration-apiserver", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

/// The swagger 2.0 document of every group-version (served as JSON only).
pub fn v2_document(kinds: &[Arc<dyn Strategy>]) -> Value {
    let mut paths = Map::new();
    let mut definitions = Map::new();
    let mut gvs = Vec::new();
    for k in kinds {
        for v in k.info().versions {
            let gv = (k.info().group, *v);
            if !gvs.contains(&gv) {
                gvs.push(gv);
            }
        }
    }
    for (g, v) in gvs {
        let mut doc = v3_document(kinds, g, v);
        rewrite_refs(&mut doc, "#/components/schemas/", "#/definitions/");
        if let Some(Value::Object(p)) = doc.get_mut("paths").map(Value::take) {
            for (path, mut item) in p {
                // v2 has body parameters instead of requestBody, and responses with a schema.
                if let Some(ops) = item.as_object_mut() {
                    for (_, o) in ops.iter_mut() {
                        if let Some(o) = o.as_object_mut() {
                            if let Some(rb) = o.remove("requestBody") {
                                let schema = rb["content"]
                                    .as_object()
                                    .and_then(|c| c.values().next())
                                    .map(|c| c["schema"].clone());
                                if let Some(Value::Array(params)) = o.get_mut("parameters") {
                                    params.push(
                                        json!({"name": "body", "in": "body", "required": true, "schema": schema}),
                                    );
                                }
                            }
                            if let Some(Value::Object(rs)) = o.get_mut("responses") {
                                for (_, r) in rs.iter_mut() {
                                    if let Some(s) = r.pointer("/content/application~1json/schema").cloned() {
                                        *r = json!({"description": "OK", "schema": s});
                                    }
                                }
                            }
                            if let Some(Value::Array(params)) = o.get_mut("parameters") {
                                for p in params.iter_mut() {
                                    if let Some(t) = p.get("schema").and_then(|s| s.get("type")).cloned() {
                                        if let Some(po) = p.as_object_mut() {
                                            po.remove("schema");
                                            po.insert("type".into(), t);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                paths.insert(path, item);
            }
        }
        if let Some(Value::Object(s)) = doc.pointer_mut("/components/schemas").map(Value::take) {
            for (n, schema) in s {
                // Two versions share a schema name; merge their GVK lists.
                if let Some(existing) = definitions.get_mut(&n) {
                    if let (Some(Value::Array(gvk)), Some(Value::Array(new_gvk))) = (
                        existing.get_mut("x-kubernetes-group-version-kind"),
                        schema.get("x-kubernetes-group-version-kind"),
                    ) {
                        for g in new_gvk {
                            if !gvk.contains(g) {
                                gvk.push(g.clone());
                            }
                        }
                    }
                    continue;
                }
                definitions.insert(n, schema);
            }
        }
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "migration-apiserver", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "definitions": definitions,
    })
}

/// All documents, prepared once.
pub struct OpenApi {
    pub v2: bytes::Bytes,
    /// The swagger 2.0 document as protobuf (gnostic `openapi.v2.Document`), for kubectl (see [`proto`]).
    pub v2_protobuf: bytes::Bytes,
    /// `apis/<g>/<v>` -> (document, upper-case hex SHA-512 of it).
    pub v3: BTreeMap<String, (bytes::Bytes, String)>,
    pub v3_root: bytes::Bytes,
}

impl OpenApi {
    pub fn build(kinds: &[Arc<dyn Strategy>]) -> OpenApi {
        let mut v3 = BTreeMap::new();
        let mut root = Map::new();
        for k in kinds {
            for v in k.info().versions {
                let key = format!("apis/{}/{v}", k.info().group);
                if v3.contains_key(&key) {
                    continue;
                }
                let body = serde_json::to_vec(&v3_document(kinds, k.info().group, v)).unwrap_or_default();
                let hash = format!("{:X}", Sha512::digest(&body));
                root.insert(key.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}")}));
                v3.insert(key, (body.into(), hash));
            }
        }
        let v2 = v2_document(kinds);
        OpenApi {
            v2_protobuf: proto::document(&v2).into(),
            v2: serde_json::to_vec(&v2).unwrap_or_default().into(),
            v3,
            v3_root: serde_json::to_vec(&json!({"paths": root})).unwrap_or_default().into(),
        }
    }
}

/// The protobuf form of the swagger 2.0 document (gnostic's `openapi.v2.Document`, which kube-apiserver serves as
/// `application/com.github.proto-openapi.spec.v2@v1.0+protobuf`). kubectl reads it for client-side validation, which
/// it does for every kind whose PATCH does not advertise `fieldValidation` — a create-only kind such as
/// CSITranslation — and fails without it. The document carries `swagger`, `info` and the definitions (what kubectl
/// reads); the paths are in the JSON form only.
pub mod proto {
    use serde_json::Value;

    /// Media types of the protobuf form (current and legacy spelling).
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
        for r in o.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
            m.string(19, r);
        }
        for e in o.get("enum").and_then(Value::as_array).into_iter().flatten() {
            m.message(20, any(e));
        }
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
        m.boolean(27, flag("readOnly"));
        if let Some(e) = o.get("example") {
            m.message(30, any(e));
        }
        for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-")) {
            m.message(31, named_any(k, v));
        }
        m
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
}
