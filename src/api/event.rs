//! Event (core `v1`), served only when the server stands alone, as [`Namespace`](super::namespace) is: then the
//! events recorders write (and `kubectl describe`, `kubectl get events` read) must be this server's. It is also the
//! stored form of the events.k8s.io/v1 Event ([`super::events_event`]): kube-apiserver keeps both as core Events
//! under `/registry/events/<namespace>/<name>`. Policy as kube-apiserver's: validation from
//! pkg/apis/core/validation/events.go, selectable fields from pkg/registry/core/event/strategy.go
//! (`ToSelectableFields`) and pkg/apis/core/v1/conversion.go (`AddFieldLabelConversionsForEvent`), printer columns
//! from pkg/printers/internalversion/printers.go (`printEvent`), all at kubernetes/kubernetes 04791b49.

use crate::api::printers::human_duration;
use crate::error::FieldError;
use crate::go_decode;
use crate::registry::strategy::{Column, Kind, KindInfo, NoStatus};
use crate::validation::NameRule;
use crate::validation::{dns1123_subdomain, qualified_name};
use k8s_openapi::api::core::v1::{EventSeries, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Event is a report of an event somewhere in the cluster.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.core.v1.Event")]
pub struct Event {
    /// Standard object's metadata.
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// The object that this event is about.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub involved_object: ObjectReference,
    /// This should be a short, machine understandable string that gives the reason for the transition into the
    /// object's current status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable description of the status of this operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The component reporting this event. Should be a short machine understandable string.
    #[serde(default, serialize_with = "source_or_empty")]
    pub source: Option<EventSource>,
    /// The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_timestamp: Option<Time>,
    /// The time at which the most recent occurrence of this event was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_timestamp: Option<Time>,
    /// The number of times this event has occurred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// Type of this event (Normal, Warning), new types could be added in the future
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Time when this Event was first observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<MicroTime>,
    /// Data about the Event series this event represents or nil if it's a singleton Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<EventSeries>,
    /// What action was taken/failed regarding to the Regarding object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// Optional secondary object for more complex actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-map-type" = "atomic"))]
    pub related: Option<ObjectReference>,
    /// Name of the controller that emitted this Event, e.g. `kubernetes.io/kubelet`.
    #[serde(default, serialize_with = "string_or_empty")]
    pub reporting_component: Option<String>,
    /// ID of the controller instance, e.g. `kubelet-xyzf`.
    #[serde(default, serialize_with = "string_or_empty")]
    pub reporting_instance: Option<String>,
}

// Written as kube-apiserver writes them: upstream's `source` is a struct and the reporting fields are strings
// without omitempty, so Go's encoder always writes them (`{}`, `""`). That also makes the zero Event the one
// kube-apiserver's field manager compares a create with, so that a create owns the same fields.
fn source_or_empty<S: serde::Serializer>(source: &Option<EventSource>, serializer: S) -> Result<S::Ok, S::Error> {
    source.clone().unwrap_or_default().serialize(serializer)
}

fn string_or_empty<S: serde::Serializer>(value: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    value.as_deref().unwrap_or_default().serialize(serializer)
}

static INFO: KindInfo = KindInfo {
    group: "",
    kind: "Event",
    list_kind: "EventList",
    plural: "events",
    singular: "event",
    namespaced: true,
    short_names: &["ev"],
    categories: &[],
    versions: &["v1"],
    // The core/v1 strategy validates no metadata (`ValidateEventCreate` returns after the legacy checks for
    // core/v1): the generic registry's path-segment check is all a name gets.
    name_rule: NameRule::PathSegment,
    // kube-apiserver's event strategy: AllowUnconditionalUpdate.
    unconditional_update: true,
    create_only: false,
    generation: false,
    return_deleted_object: false,
    api_approved: None,
    priority: None,
};

crate::kube_resource!(Event, kube::core::NamespaceResourceScope);

/// The `type`s events.k8s.io/v1 allows.
pub const EVENT_TYPES: [&str; 2] = ["Normal", "Warning"];
/// pkg/apis/core/validation/events.go's limits.
const REPORTING_INSTANCE_LENGTH_LIMIT: usize = 128;
const ACTION_LENGTH_LIMIT: usize = 128;
const REASON_LENGTH_LIMIT: usize = 128;
const NOTE_LENGTH_LIMIT: usize = 1024;
/// The reporting controller's field as events.k8s.io names it (core/v1 names it `reportingComponent`).
const STRICT_REPORTING_CONTROLLER: &str = "reportingController";

/// The field labels of core/v1 Events (pkg/apis/core/v1/conversion.go), besides metadata's.
pub const FIELD_LABELS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

fn text(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or_default()
}

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

impl Event {
    /// `legacyValidateEvent`: what every event must satisfy, whatever the version it is written in. The reporting
    /// controller's field is named as the request's version names it: `reportingComponent` in core/v1,
    /// `reportingController` in events.k8s.io/v1.
    pub fn validate_legacy(&self, reporting_controller: &str) -> Vec<FieldError> {
        let mut errs = Vec::new();
        let namespace = text(&self.metadata.namespace);
        let involved_ns = text(&self.involved_object.namespace);
        let mismatch =
            || FieldError::invalid("involvedObject.namespace", involved_ns, "does not match event.namespace");
        if self.event_time.is_none() {
            // Old events: the namespaces agree, or a cluster object's event is in "" or "default".
            let agrees = match involved_ns.is_empty() {
                true => namespace.is_empty() || namespace == "default",
                false => namespace == involved_ns,
            };
            if !agrees {
                errs.push(mismatch());
            }
        } else {
            if involved_ns.is_empty() && namespace != "default" && namespace != "kube-system" {
                errs.push(mismatch());
            }
            let controller = text(&self.reporting_component);
            if controller.is_empty() {
                errs.push(FieldError::required(reporting_controller));
            }
            for msg in qualified_name(controller) {
                errs.push(FieldError::invalid(reporting_controller, controller, &msg));
            }
            let at_most = |n: usize| format!("can have at most {n} characters");
            let instance = text(&self.reporting_instance);
            if instance.is_empty() {
                errs.push(FieldError::required("reportingInstance"));
            }
            if instance.len() > REPORTING_INSTANCE_LENGTH_LIMIT {
                errs.push(FieldError::invalid("reportingInstance", "", &at_most(REPORTING_INSTANCE_LENGTH_LIMIT)));
            }
            let action = text(&self.action);
            if action.is_empty() {
                errs.push(FieldError::required("action"));
            }
            if action.len() > ACTION_LENGTH_LIMIT {
                errs.push(FieldError::invalid("action", "", &at_most(ACTION_LENGTH_LIMIT)));
            }
            let reason = text(&self.reason);
            if reason.is_empty() {
                errs.push(FieldError::required("reason"));
            }
            if reason.len() > REASON_LENGTH_LIMIT {
                errs.push(FieldError::invalid("reason", "", &at_most(REASON_LENGTH_LIMIT)));
            }
            if text(&self.message).len() > NOTE_LENGTH_LIMIT {
                errs.push(FieldError::invalid("message", "", &at_most(NOTE_LENGTH_LIMIT)));
            }
        }
        for msg in dns1123_subdomain(namespace) {
            errs.push(FieldError::invalid("namespace", namespace, &msg));
        }
        errs
    }

    /// `validateV1EventSeries`.
    fn validate_series(&self) -> Vec<FieldError> {
        let Some(series) = &self.series else { return Vec::new() };
        let mut errs = Vec::new();
        if series.count.unwrap_or(0) < 2 {
            errs.push(FieldError::invalid("series.count", "", "should be at least 2"));
        }
        if series.last_observed_time.is_none() {
            errs.push(FieldError::required("series.lastObservedTime"));
        }
        errs
    }

    /// `ValidateEventCreate` for events.k8s.io/v1: the legacy checks and the new API's requirements, without the
    /// object metadata's.
    pub fn validate_strict_create(&self) -> Vec<FieldError> {
        self.validate_strict_create_with(Vec::new())
    }

    /// `ValidateEventCreate` for events.k8s.io/v1 with `meta`, the errors of its `ValidateObjectMeta` (a DNS
    /// subdomain name), where upstream reports them: after the legacy checks, before the new API's.
    pub fn validate_strict_create_with(&self, meta: Vec<FieldError>) -> Vec<FieldError> {
        let mut errs = self.validate_legacy(STRICT_REPORTING_CONTROLLER);
        errs.extend(meta);
        errs.extend(self.validate_series());
        if self.event_time.is_none() {
            errs.push(FieldError::required("eventTime"));
        }
        let type_ = text(&self.type_);
        if !EVENT_TYPES.contains(&type_) {
            errs.push(FieldError::invalid("type", "", &format!("has invalid value: {type_}")));
        }
        let needs_unset = |field: &str| FieldError::invalid(field, "", "needs to be unset");
        if self.first_timestamp.is_some() {
            errs.push(needs_unset("firstTimestamp"));
        }
        if self.last_timestamp.is_some() {
            errs.push(needs_unset("lastTimestamp"));
        }
        if self.count.unwrap_or(0) != 0 {
            errs.push(needs_unset("count"));
        }
        let source = self.source.clone().unwrap_or_default();
        if !text(&source.component).is_empty() || !text(&source.host).is_empty() {
            errs.push(needs_unset("source"));
        }
        errs
    }

    /// `ValidateEventUpdate` for events.k8s.io/v1: the legacy checks, a changed series valid, the rest immutable
    /// (strings and the count quoted as Go's zero values when unset; structs as JSON).
    pub fn validate_strict_update(&self, old: &Event) -> Vec<FieldError> {
        let mut errs = self.validate_legacy(STRICT_REPORTING_CONTROLLER);
        if self.series != old.series {
            errs.extend(self.validate_series());
        }
        let mut immutable = |field: &str, new: Value, old: Value| {
            if new != old {
                errs.push(FieldError::immutable(field, &new));
            }
        };
        immutable("involvedObject", to_value(&self.involved_object), to_value(&old.involved_object));
        immutable("reason", Value::from(text(&self.reason)), Value::from(text(&old.reason)));
        immutable("message", Value::from(text(&self.message)), Value::from(text(&old.message)));
        let source = |e: &Event| to_value(&e.source.clone().unwrap_or_default());
        immutable("source", source(self), source(old));
        immutable("firstTimestamp", to_value(&self.first_timestamp), to_value(&old.first_timestamp));
        immutable("lastTimestamp", to_value(&self.last_timestamp), to_value(&old.last_timestamp));
        immutable("count", Value::from(self.count.unwrap_or(0)), Value::from(old.count.unwrap_or(0)));
        immutable("type", Value::from(text(&self.type_)), Value::from(text(&old.type_)));
        immutable("eventTime", to_value(&self.event_time), to_value(&old.event_time));
        immutable("action", Value::from(text(&self.action)), Value::from(text(&old.action)));
        immutable("related", to_value(&self.related), to_value(&old.related));
        immutable(
            "reportingController",
            Value::from(text(&self.reporting_component)),
            Value::from(text(&old.reporting_component)),
        );
        immutable(
            "reportingInstance",
            Value::from(text(&self.reporting_instance)),
            Value::from(text(&old.reporting_instance)),
        );
        errs
    }

    /// `ToSelectableFields`, in core/v1's labels.
    pub fn core_selectable_fields(&self) -> Vec<(&'static str, String)> {
        let o = &self.involved_object;
        let source = self.source.as_ref().and_then(|s| s.component.clone()).filter(|c| !c.is_empty());
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        vec![
            ("involvedObject.kind", s(&o.kind)),
            ("involvedObject.namespace", s(&o.namespace)),
            ("involvedObject.name", s(&o.name)),
            ("involvedObject.uid", s(&o.uid)),
            ("involvedObject.apiVersion", s(&o.api_version)),
            ("involvedObject.resourceVersion", s(&o.resource_version)),
            ("involvedObject.fieldPath", s(&o.field_path)),
            ("reason", s(&self.reason)),
            ("reportingComponent", s(&self.reporting_component)),
            ("source", source.unwrap_or_else(|| s(&self.reporting_component))),
            ("type", s(&self.type_)),
        ]
    }
}

/// `translateTimestampSince` and `translateMicroTimestampSince`: the age of a time, `<unknown>` when unset.
fn since(t: Option<k8s_openapi::jiff::Timestamp>, now: chrono::DateTime<chrono::Utc>) -> String {
    match t.and_then(|t| chrono::DateTime::<chrono::Utc>::from_timestamp(t.as_second(), t.subsec_nanosecond() as u32)) {
        Some(t) => human_duration(now - t),
        None => "<unknown>".into(),
    }
}

impl Kind for Event {
    fn info() -> &'static KindInfo {
        &INFO
    }
    type Status = NoStatus;
    fn replace_status(&mut self, status: NoStatus) -> NoStatus {
        status
    }
    /// core/v1 is lenient: only the legacy checks, for compatibility with old clients; the metadata is checked
    /// after them, and only when they passed ([`NameRule::PathSegment`]).
    fn validate(&self) -> Vec<FieldError> {
        self.validate_legacy("reportingComponent")
    }
    const NAME_AND_AGE_COLUMNS: bool = false;
    fn columns() -> Vec<Column> {
        vec![
            Column::new("Last Seen", "string", "The time at which the most recent occurrence of this event was recorded."),
            Column::new("Type", "string", "Type of this event (Normal, Warning), new types could be added in the future"),
            Column::new("Reason", "string", "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
            Column::new("Object", "string", "The object that this event is about."),
            Column::new("Subobject", "string", "If referring to a piece of an object instead of an entire object, this string should contain a valid JSON/Go field access statement, such as desiredState.manifest.containers[2].").wide(),
            Column::new("Source", "string", "The component reporting this event. Should be a short machine understandable string.").wide(),
            Column::new("Message", "string", "A human-readable description of the status of this operation."),
            Column::new("First Seen", "string", "The time at which the event was first recorded. (Time of server receipt is in TypeMeta.)").wide(),
            Column::new("Count", "string", "The number of times this event has occurred.").wide(),
            Column { format: "name", ..Column::new("Name", "string", "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names") }.wide(),
        ]
    }
    /// `printEvent` with Wide, as kube-apiserver's Table conversion always prints.
    fn cells(&self, now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        let first = match &self.first_timestamp {
            Some(t) => since(Some(t.0), now),
            None => since(self.event_time.as_ref().map(|t| t.0), now),
        };
        let mut last = match &self.last_timestamp {
            Some(t) => since(Some(t.0), now),
            None => first.clone(),
        };
        let mut count = self.count.unwrap_or(0);
        if let Some(series) = &self.series {
            last = since(series.last_observed_time.as_ref().map(|t| t.0), now);
            count = series.count.unwrap_or(0);
        } else if count == 0 {
            // Singleton events don't have a count set in the new API.
            count = 1;
        }
        let o = &self.involved_object;
        let kind = text(&o.kind).to_lowercase();
        let target = match text(&o.name) {
            "" => kind,
            name => format!("{kind}/{name}"),
        };
        let source = self.source.clone().unwrap_or_default();
        let component =
            Some(text(&source.component)).filter(|c| !c.is_empty()).unwrap_or(text(&self.reporting_component));
        let instance = Some(text(&source.host)).filter(|h| !h.is_empty()).unwrap_or(text(&self.reporting_instance));
        let source = if instance.is_empty() { component.to_string() } else { format!("{component}, {instance}") };
        vec![
            Value::from(last),
            Value::from(text(&self.type_)),
            Value::from(text(&self.reason)),
            Value::from(target),
            Value::from(text(&o.field_path)),
            Value::from(source),
            Value::from(text(&self.message).trim()),
            Value::from(first),
            Value::from(i64::from(count)),
            Value::from(text(&self.metadata.name)),
        ]
    }
    const FIELD_LABELS: &'static [&'static str] = FIELD_LABELS;
    fn selectable_fields(&self) -> Vec<(&'static str, String)> {
        self.core_selectable_fields()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(v: Value) -> Event {
        serde_json::from_value(v).expect("an Event")
    }

    /// pkg/apis/core/validation/events_test.go (kubernetes/kubernetes 05c351a9), `TestValidateEventForCoreV1Events`:
    /// core/v1 checks only that the namespaces agree and are valid.
    #[test]
    fn core_v1_events_validate_leniently() {
        let cases = [
            ("foo", "bar", false),
            ("aoeu-_-aoeu", "aoeu-_-aoeu", false),
            ("default", "", true),
            ("default", "default", true),
            ("default", "foo", false),
            ("foo", "foo", true),
            ("foo", "", false),
            ("", "bar", false),
        ];
        for (namespace, involved, valid) in cases {
            let e = event(json!({"metadata": {"name": "test", "namespace": namespace},
                                 "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "namespace": involved}}));
            assert_eq!(e.validate().is_empty(), valid, "{namespace:?} {involved:?}: {:?}", e.validate());
            assert_eq!(e.validate_update(&Event::default()).is_empty(), valid, "{namespace:?} {involved:?} (update)");
        }
    }

    /// The same file's `TestValidateEventCreateForNewV1Events`: events.k8s.io/v1 requires what the new API says,
    /// with kube-apiserver's field paths (the object's name is the registry's metadata check).
    #[test]
    fn new_v1_events_validate_strictly() {
        let valid = json!({"metadata": {"name": "test", "namespace": "kube-system"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node"}, "eventTime": "2017-09-19T13:49:16.000000Z",
            "reportingComponent": "k8s.io/my-controller", "reportingInstance": "node-xyz", "action": "Do",
            "reason": "Because", "type": "Normal"});
        let with = |patch: Value| {
            let mut v = valid.clone();
            json_patch::merge(&mut v, &patch);
            // The fields with errors, in order (an empty reportingController is both required and not a name).
            let mut fields: Vec<String> = event(v).validate_strict_create().into_iter().map(|e| e.field).collect();
            fields.dedup();
            fields
        };
        assert_eq!(with(json!({})), Vec::<String>::new());
        let long = "z".repeat(129);
        let cases: [(Value, &[&str]); 12] = [
            (json!({"metadata": {"namespace": ""}}), &["involvedObject.namespace", "namespace"]),
            // Without eventTime the legacy rule applies: a cluster object's event is in "" or "default".
            (json!({"eventTime": null}), &["involvedObject.namespace", "eventTime"]),
            (json!({"eventTime": null, "metadata": {"namespace": "default"}}), &["eventTime"]),
            (json!({"reportingComponent": "my-contr@ller"}), &["reportingController"]),
            (json!({"reportingComponent": null}), &["reportingController"]),
            (json!({"reportingInstance": long}), &["reportingInstance"]),
            (json!({"reason": null}), &["reason"]),
            (json!({"action": null}), &["action"]),
            (json!({"message": "z".repeat(1025)}), &["message"]),
            (json!({"type": "Bad"}), &["type"]),
            (json!({"series": {"count": 1}}), &["series.count", "series.lastObservedTime"]),
            (
                json!({"firstTimestamp": "2017-09-19T13:49:16Z", "lastTimestamp": "2017-09-19T13:49:16Z",
                       "count": 2, "source": {"component": "c"}}),
                &["firstTimestamp", "lastTimestamp", "count", "source"],
            ),
        ];
        for (patch, fields) in cases {
            assert_eq!(with(patch.clone()), fields, "{patch}");
        }
    }

    /// `ValidateEventUpdate` for the new API: what was written stays, a changed series must be valid.
    #[test]
    fn new_v1_event_updates_keep_what_was_written() {
        let old = event(
            json!({"metadata": {"name": "e", "namespace": "default"}, "eventTime": "2017-09-19T13:49:16.000000Z",
            "reportingComponent": "c", "reportingInstance": "i", "action": "Do", "reason": "R", "type": "Normal",
            "message": "m"}),
        );
        let mut new = old.clone();
        new.message = Some("changed".into());
        new.series = Some(EventSeries { count: Some(1), last_observed_time: None });
        let fields: Vec<String> = new.validate_strict_update(&old).into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["series.count", "series.lastObservedTime", "message"]);
    }

    /// `printEvent`: a series' last observation and count, the source from the reporting controller, the object as
    /// `kind/name` in lower case.
    #[test]
    fn cells_as_kube_apiserver_prints_them() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-21T04:00:00Z").unwrap().with_timezone(&chrono::Utc);
        let e = event(json!({"metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "StorageVersionMigration", "name": "m"}, "eventTime": "2026-11-21T03:00:00.000000Z",
            "series": {"count": 4, "lastObservedTime": "2026-11-21T03:59:00.000000Z"}, "reportingComponent": "ctl",
            "reportingInstance": "i-1", "reason": "Done", "message": " ok \n", "type": "Normal"}));
        let want = json!(["60s", "Normal", "Done", "storageversionmigration/m", "", "ctl, i-1", "ok", "60m", 4, "e"]);
        assert_eq!(Value::Array(e.cells(now)), want);
        assert_eq!(Event::columns().len(), want.as_array().map_or(0, Vec::len));
    }

    /// k8s.io/api/core/v1 Event: `involvedObject` and `source` are struct values, the times and strings values;
    /// `series` and `related` pointers. A `null` involvedObject is the zero reference, whose empty namespace the
    /// legacy rule takes in "default" and refuses elsewhere.
    #[test]
    fn missing_and_null_fields_decode_as_go() {
        let e = event(json!({"metadata": {"name": "e", "namespace": "default"}, "involvedObject": null,
                             "source": null, "firstTimestamp": null, "count": null, "series": null, "related": null,
                             "reportingComponent": null}));
        assert_eq!(e.involved_object, ObjectReference::default());
        assert!(e.validate().is_empty(), "{:?}", e.validate());
        let e = event(json!({"metadata": {"name": "e", "namespace": "foo"}, "involvedObject": null}));
        let fields: Vec<String> = e.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["involvedObject.namespace"]);
        assert_eq!(event(json!({"metadata": null})).metadata, ObjectMeta::default());
    }

    /// `legacyValidateEvent` names the reporting controller's field as the request's version does: an Event with
    /// an eventTime written through core/v1 without `reportingComponent` (missing or `null`, "" as in Go) is
    /// refused at `reportingComponent`, the same event through events.k8s.io at `reportingController`.
    #[test]
    fn the_reporting_controller_is_named_as_the_version_names_it() {
        let e = event(
            json!({"metadata": {"name": "e", "namespace": "default"}, "eventTime": "2017-09-19T13:49:16.000000Z",
            "reportingComponent": null, "reportingInstance": "i", "action": "Do", "reason": "R", "type": "Normal"}),
        );
        let fields = |errs: Vec<FieldError>| {
            let mut fields: Vec<String> = errs.into_iter().map(|e| e.field).collect();
            fields.dedup();
            fields
        };
        assert_eq!(fields(e.validate()), ["reportingComponent"]);
        assert_eq!(fields(e.validate_strict_create()), ["reportingController"]);
    }
}
