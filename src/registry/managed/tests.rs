//! Table-driven tests of the merge and of ownership, on a schema with every kind of node.

use super::shape::Shape;
use super::*;
use serde_json::json;

fn shape() -> Shape {
    let defs = json!({
        "K": {"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "x": {"type": "integer"}, "y": {"type": "string"},
                "byName": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "v": {"type": "integer"}, "w": {"type": "integer"}}},
                    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
                "atomic": {"type": "array", "items": {"type": "string"}},
                "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "data": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }},
            "status": {"type": "object", "properties": {
                "conditions": {"type": "array", "items": {"type": "object", "properties": {
                    "type": {"type": "string"}, "status": {"type": "string"}}},
                    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}}}
        }}
    });
    Shape::of_kind("K", defs.as_object().unwrap())
}

fn obj(spec: Value) -> Value {
    json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "o"}, "spec": spec})
}

#[test]
fn merge_table() {
    let s = shape();
    // (what, live spec, applied spec, merged spec)
    let cases = [
        ("scalars replaced, others kept", json!({"x": 1, "y": "a"}), json!({"x": 2}), json!({"x": 2, "y": "a"})),
        (
            "map list merged by key; live-only items keep their place",
            json!({"byName": [{"name": "a", "v": 1}, {"name": "b", "v": 1, "w": 1}]}),
            json!({"byName": [{"name": "b", "v": 2}, {"name": "c"}]}),
            json!({"byName": [{"name": "a", "v": 1}, {"name": "b", "v": 2, "w": 1}, {"name": "c"}]}),
        ),
        (
            "shared items in the configuration's order",
            json!({"byName": [{"name": "a"}, {"name": "b"}]}),
            json!({"byName": [{"name": "b"}, {"name": "a"}]}),
            json!({"byName": [{"name": "b"}, {"name": "a"}]}),
        ),
        ("atomic lists replaced", json!({"atomic": ["a", "b"]}), json!({"atomic": ["c"]}), json!({"atomic": ["c"]})),
        ("sets united", json!({"tags": ["a", "b"]}), json!({"tags": ["c", "a"]}), json!({"tags": ["c", "a", "b"]})),
        (
            "untyped objects merged key by key, their lists atomic",
            json!({"data": {"k": {"a": 1}, "l": [1, 2]}}),
            json!({"data": {"k": {"b": 2}, "l": [3]}}),
            json!({"data": {"k": {"a": 1, "b": 2}, "l": [3]}}),
        ),
    ];
    for (what, live, config, want) in cases {
        assert_eq!(walk::merge(&obj(live), &obj(config), &s).unwrap()["spec"], want, "{what}");
    }
    let dup = obj(json!({"byName": [{"name": "a"}, {"name": "a"}]}));
    assert_eq!(
        walk::config_set(&dup, &s).unwrap_err().to_string(),
        r#".spec.byName: duplicate entries for key [name="a"]"#
    );
    assert!(walk::to_set(&dup, &s).is_ok(), "a live object may hold duplicates");
    let keyless = walk::to_set(&obj(json!({"byName": [{"v": 1}]})), &s).unwrap_err().to_string();
    assert!(keyless.contains("omits key field \"name\""), "{keyless}");
}

#[test]
fn field_sets_as_upstream() {
    let s = shape();
    let set = walk::to_set(
        &obj(json!({"x": 1, "byName": [{"name": "a", "v": 1}], "tags": ["t"], "data": {"k": {"z": 1}}, "atomic": []})),
        &s,
    )
    .unwrap();
    let scope = Scope { shape: &s, api_version: "g/v1", subresource: Subresource::Main, has_status: true };
    assert_eq!(
        scope.filter(&set).to_fields_v1(),
        json!({"f:spec": {
            "f:x": {},
            "f:atomic": {},
            "f:byName": {"k:{\"name\":\"a\"}": {".": {}, "f:name": {}, "f:v": {}}},
            "f:tags": {"v:\"t\"": {}},
            "f:data": {"f:k": {".": {}, "f:z": {}}}
        }})
    );
}

struct World {
    shape: Shape,
    managers: Managers,
    object: Value,
}

impl World {
    fn new() -> World {
        World { shape: shape(), managers: Managers::default(), object: obj(json!({})) }
    }
    fn scope(&self, sub: &'static str) -> Scope<'_> {
        let subresource = Subresource::parse(sub).expect("a subresource");
        Scope { shape: &self.shape, api_version: "g/v1", subresource, has_status: true }
    }
    fn apply(&mut self, manager: &str, config: Value, force: bool) -> Result<(), ApiError> {
        self.apply_to("", manager, config, force)
    }
    fn apply_to(&mut self, sub: &'static str, manager: &str, config: Value, force: bool) -> Result<(), ApiError> {
        let mut m = self.managers.clone();
        let empty = obj(json!({}));
        let merged = m.apply(&self.scope(sub), &empty, &self.object, &config, manager, force)?;
        self.managers = m;
        self.object = merged;
        Ok(())
    }
    fn update(&mut self, manager: &str, new: Value) {
        let mut m = self.managers.clone();
        m.update(&self.scope(""), &self.object, &new, manager);
        self.managers = m;
        self.object = new;
    }
    /// manager -> its paths.
    fn owners(&self) -> BTreeMap<String, Vec<String>> {
        self.managers
            .0
            .iter()
            .map(|(id, o)| {
                (format!("{}/{}", id.manager, id.operation), o.set.paths().iter().map(|p| path_string(p)).collect())
            })
            .collect()
    }
}

#[test]
fn ownership_conflicts_and_force() {
    let mut w = World::new();
    w.apply("a", obj(json!({"x": 1, "y": "keep"})), false).unwrap();
    // The same value: shared, no conflict.
    w.apply("b", obj(json!({"x": 1})), false).unwrap();
    assert_eq!(w.owners()["a/Apply"], [".spec.x", ".spec.y"]);
    assert_eq!(w.owners()["b/Apply"], [".spec.x"]);
    // Another value: a conflict with both owners, nothing changed.
    let e = w.apply("c", obj(json!({"x": 2})), false).unwrap_err();
    assert_eq!(
        e.message,
        "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.x\nconflicts with \"b\":\n- .spec.x"
    );
    assert_eq!(w.object["spec"]["x"], 1);
    // Forced: c takes x from both; b owned nothing else and is gone.
    w.apply("c", obj(json!({"x": 2})), true).unwrap();
    let e = w.apply("d", obj(json!({"x": 3, "y": "other"})), false).unwrap_err();
    assert_eq!(e.code, 409);
    assert_eq!(
        e.message,
        "Apply failed with 2 conflicts: conflicts with \"a\":\n- .spec.y\nconflicts with \"c\":\n- .spec.x"
    );
    let status = e.status();
    assert_eq!(
        status["details"]["causes"],
        json!([
            {"reason": "FieldManagerConflict", "message": "conflict with \"a\"", "field": ".spec.y"},
            {"reason": "FieldManagerConflict", "message": "conflict with \"c\"", "field": ".spec.x"}
        ])
    );
    assert_eq!(w.object["spec"]["x"], 2);
    let one = w.apply("d", obj(json!({"x": 3})), false).unwrap_err();
    assert_eq!(one.message, "Apply failed with 1 conflict: conflict with \"c\": .spec.x");
    // Forced: d takes x from everyone.
    w.apply("d", obj(json!({"x": 3})), true).unwrap();
    assert_eq!(w.object["spec"], json!({"x": 3, "y": "keep"}));
    let owners = w.owners();
    assert_eq!(owners["a/Apply"], [".spec.y"]);
    assert!(!owners.contains_key("b/Apply") && !owners.contains_key("c/Apply"), "{owners:?}");
    assert_eq!(owners["d/Apply"], [".spec.x"]);
}

#[test]
fn fields_left_out_of_an_apply_are_removed_unless_owned() {
    let mut w = World::new();
    w.apply("a", obj(json!({"x": 1, "y": "y", "byName": [{"name": "n", "v": 1}], "tags": ["t", "u"]})), false).unwrap();
    w.apply("b", obj(json!({"y": "y"})), false).unwrap();
    w.apply("a", obj(json!({"tags": ["u"]})), false).unwrap();
    // x, the item and tag t were a's alone: gone; y is b's too: kept.
    // byName held only a's item: the field goes with it, as structured-merge-diff removes a declared field.
    assert_eq!(w.object["spec"], json!({"y": "y", "tags": ["u"]}));
    assert_eq!(w.owners()["a/Apply"], [r#".spec.tags[="u"]"#]);
}

#[test]
fn a_partly_owned_field_is_not_pruned_whole() {
    let mut w = World::new();
    w.apply("a", obj(json!({"byName": [{"name": "n", "v": 1}], "data": {"k": 1}})), false).unwrap();
    // a's entry as kubectl rewrites it when it takes over client-side apply: the list and the object themselves.
    let m = w.managers.0.iter_mut().next().unwrap().1;
    m.set.insert(&[PathElement::Field("spec".into()), PathElement::Field("byName".into())]);
    m.set.insert(&[PathElement::Field("spec".into()), PathElement::Field("data".into())]);
    w.apply("a", obj(json!({"byName": [{"name": "n", "v": 1}]})), false).unwrap();
    assert_eq!(w.object["spec"], json!({"byName": [{"name": "n", "v": 1}]}), "the list stays, data goes");
}

#[test]
fn a_list_item_is_pruned_whole_even_with_parts_owned_by_others() {
    let mut w = World::new();
    w.apply("a", obj(json!({"x": 1, "byName": [{"name": "n", "v": 1}]})), false).unwrap();
    let mut new = w.object.clone();
    new["spec"]["byName"][0]["w"] = json!(2);
    w.update("b", new);
    w.apply("a", obj(json!({"x": 1})), false).unwrap();
    // As structured-merge-diff: the item goes (never a keyless half item), and b owns nothing any more.
    assert_eq!(w.object["spec"], json!({"x": 1, "byName": []}));
    assert!(!w.owners().contains_key("b/Update"), "{:?}", w.owners());
}

#[test]
fn null_in_a_configuration_keeps_what_others_set() {
    let mut w = World::new();
    let mut live = obj(json!({"data": {"k": 1}}));
    live["metadata"]["annotations"] = json!({"team": "a"});
    w.update("someone", live);
    let mut config = obj(json!({"data": null}));
    config["metadata"]["annotations"] = Value::Null;
    w.apply("helm", config, true).unwrap();
    assert_eq!(w.object["metadata"]["annotations"], json!({"team": "a"}));
    assert_eq!(w.object["spec"]["data"], json!({"k": 1}));
    // A scalar set to null is null.
    w.apply("helm", obj(json!({"x": null})), true).unwrap();
    assert_eq!(w.object["spec"]["x"], Value::Null);
}

#[test]
fn update_managers_are_capped_at_ten() {
    let mut w = World::new();
    for i in 0..13 {
        let mut new = w.object.clone();
        if new["spec"].get("data").is_none() {
            new["spec"]["data"] = json!({});
        }
        new["spec"]["data"][format!("k{i}")] = json!(i);
        w.update(&format!("client-{i:02}"), new);
    }
    let owners = w.owners();
    let updaters: Vec<&String> = owners.keys().filter(|k| k.ends_with("/Update")).collect();
    assert_eq!(updaters.len(), 10, "{owners:?}");
    assert!(owners.contains_key("ancient-changes/Update"), "{owners:?}");
}

#[test]
fn updates_take_what_they_change() {
    let mut w = World::new();
    w.apply("a", obj(json!({"x": 1, "byName": [{"name": "n", "v": 1, "w": 1}]})), false).unwrap();
    let mut new = w.object.clone();
    new["spec"]["byName"][0]["v"] = json!(2);
    new["spec"]["y"] = json!("new");
    w.update("editor", new);
    let owners = w.owners();
    assert_eq!(owners["editor/Update"], [r#".spec.byName[name="n"].v"#, ".spec.y"]);
    assert_eq!(
        owners["a/Apply"],
        [".spec.byName[name=\"n\"]", ".spec.byName[name=\"n\"].name", ".spec.byName[name=\"n\"].w", ".spec.x"]
    );
    // An update that removes a field: no one owns it any more.
    let mut new = w.object.clone();
    new["spec"].as_object_mut().unwrap().remove("x");
    w.update("editor", new);
    assert!(!w.owners()["a/Apply"].contains(&".spec.x".to_string()));
    // A no-op update records nothing new.
    let before = w.owners();
    w.update("idle", w.object.clone());
    assert_eq!(w.owners(), before);
    // An apply on a field an updater owns conflicts, naming the updater with its API version.
    let e = w.apply("a", obj(json!({"y": "mine"})), false).unwrap_err();
    assert_eq!(e.message, "Apply failed with 1 conflict: conflict with \"editor\" using g/v1: .spec.y");
}

#[test]
fn status_is_owned_through_its_subresource_only() {
    let mut w = World::new();
    let mut config = obj(json!({"x": 1}));
    config["status"] = json!({"conditions": [{"type": "Running", "status": "True"}]});
    w.apply("a", config.clone(), false).unwrap();
    assert_eq!(w.owners()["a/Apply"], [".spec.x"], "the main resource does not own status");
    w.apply_to(
        "status",
        "ctl",
        json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "o"},
        "status": {"conditions": [{"type": "Running", "status": "False"}]}}),
        false,
    )
    .unwrap();
    let paths: Vec<String> = w.owners()["ctl/Apply"].clone();
    assert_eq!(
        paths,
        [
            r#".status.conditions[type="Running"]"#,
            r#".status.conditions[type="Running"].status"#,
            r#".status.conditions[type="Running"].type"#
        ]
    );
    let e = Managers::decode(&w.managers.encode().unwrap()).unwrap();
    let status = e.0.keys().find(|id| id.manager == "ctl").unwrap();
    assert_eq!(status.subresource, "status");
}

#[test]
fn managed_fields_round_trip_and_sort_as_upstream() {
    let mut w = World::new();
    w.apply("zeta", obj(json!({"x": 1})), false).unwrap();
    let mut new = w.object.clone();
    new["spec"]["y"] = json!("u");
    w.update("alpha", new);
    let entries = w.managers.encode().unwrap();
    let ops: Vec<(&str, &str)> =
        entries.iter().map(|e| (e.operation.as_deref().unwrap(), e.manager.as_deref().unwrap())).collect();
    assert_eq!(ops, [("Apply", "zeta"), ("Update", "alpha")]);
    assert!(entries.iter().all(|e| e.time.is_some() && e.fields_type.as_deref() == Some("FieldsV1")));
    let again = Managers::decode(&entries).unwrap().encode().unwrap();
    assert_eq!(again, entries);
    // Entries kube-apiserver would not decode are refused (an update then keeps the current ones).
    assert!(Managers::decode(&[ManagedFieldsEntry::default()]).is_err());
    let mut bad = entries[0].clone();
    bad.fields_type = Some("FieldsV2".into());
    assert!(Managers::decode(&[bad]).is_err());
}

#[test]
fn first_apply_to_an_object_without_managers_conflicts_on_its_fields() {
    let mut w = World::new();
    w.object = obj(json!({"x": 1}));
    let e = w.apply("a", obj(json!({"x": 2})), false).unwrap_err();
    assert!(e.message.contains("conflict with \"before-first-apply\" using g/v1: .spec.x"), "{}", e.message);
}

#[test]
fn kubectl_takes_over_fields_of_its_client_side_apply() {
    let mut w = World::new();
    let last = obj(json!({"x": 1}));
    let mut live = obj(json!({"x": 1, "y": "other"}));
    live["metadata"]["annotations"] = json!({LAST_APPLIED: last.to_string()});
    w.update("kubectl-client-side-apply", live);
    w.update("someone", {
        let mut o = w.object.clone();
        o["spec"]["y"] = json!("theirs");
        o
    });
    // x came from the annotation: kubectl may change it; y did not: a conflict.
    w.apply(KUBECTL, obj(json!({"x": 2})), false).unwrap();
    assert_eq!(w.object["spec"]["x"], 2);
    let annotation = w.object["metadata"]["annotations"][LAST_APPLIED].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(annotation).unwrap()["spec"], json!({"x": 2}));
    assert_eq!(w.apply(KUBECTL, obj(json!({"x": 2, "y": "mine"})), false).unwrap_err().code, 409);
    // Another manager gets no such allowance.
    assert_eq!(w.apply("other", obj(json!({"x": 5})), false).unwrap_err().code, 409);
}
