//! Event (`events.k8s.io/v1`), served only standalone, stored as the core/v1 [`Event`](super::event::Event) (as
//! kube-apiserver stores it), which both groups read and write: the conversion is pkg/apis/events/v1/conversion.go's
//! (`regarding` <-> `involvedObject`, `note` <-> `message`, `deprecatedSource` <-> `source`, the `deprecated*`
//! timestamps and count, `reportingController` <-> `reportingComponent`), the field labels its
//! `AddFieldLabelConversionsForEvent` (kubernetes/kubernetes 1b871091), validation the strict
//! `ValidateEventCreate`/`ValidateEventUpdate` of the new API.

use super::event::Event as CoreEvent;
use crate::error::FieldError;
use crate::go_decode;
use crate::registry::strategy::{Column, Kind, KindInfo, NoStatus, StoredAs};
use crate::validation::NameRule;
use k8s_openapi::api::core::v1::{EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Event is a report of an event somewhere in the cluster. It generally denotes some state change in the system.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.events.v1.Event")]
pub struct Event {
    /// Standard object's metadata.
    #[serde(default, deserialize_with = "go_decode::object_meta")]
    pub metadata: ObjectMeta,
    /// eventTime is the time when this Event was first observed. It is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_time: Option<MicroTime>,
    /// series is data about the Event series this event represents or nil if it's a singleton Event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<EventSeries>,
    /// reportingController is the name of the controller that emitted this Event, e.g. `kubernetes.io/kubelet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting_controller: Option<String>,
    /// reportingInstance is the ID of the controller instance, e.g. `kubelet-xyzf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reporting_instance: Option<String>,
    /// action is what action was taken/failed regarding to the regarding object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// reason is why the action was taken. It is human-readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// regarding contains the object this Event is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regarding: Option<ObjectReference>,
    /// related is the optional secondary object for more complex actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub related: Option<ObjectReference>,
    /// note is a human-readable description of the status of this operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// type is the type of this event (Normal, Warning), new types could be added in the future.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// deprecatedSource is the deprecated field assuring backward compatibility with core.v1 Event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated_source: Option<EventSource>,
    /// deprecatedFirstTimestamp is the deprecated field assuring backward compatibility with core.v1 Event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated_first_timestamp: Option<Time>,
    /// deprecatedLastTimestamp is the deprecated field assuring backward compatibility with core.v1 Event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated_last_timestamp: Option<Time>,
    /// deprecatedCount is the deprecated field assuring backward compatibility with core.v1 Event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecated_count: Option<i32>,
}

/// EventSeries contain information on series of events, i.e. thing that was/is happening continuously for some time.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "io.k8s.api.events.v1.EventSeries")]
pub struct EventSeries {
    /// count is the number of occurrences in this series up to the last heartbeat time.
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    pub count: i32,
    /// lastObservedTime is the time when last Event from the series was seen before last heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_observed_time: Option<MicroTime>,
}

static INFO: KindInfo = KindInfo {
    group: "events.k8s.io",
    kind: "Event",
    list_kind: "EventList",
    plural: "events",
    singular: "event",
    namespaced: true,
    short_names: &["ev"],
    categories: &[],
    versions: &["v1"],
    name_rule: NameRule::Subdomain,
    unconditional_update: true,
    create_only: false,
    generation: false,
    return_deleted_object: false,
    api_approved: None,
    priority: None,
};

crate::kube_resource!(Event, kube::core::NamespaceResourceScope);

/// The field labels of events.k8s.io/v1 and the core/v1 labels they stand for (pkg/apis/events/v1/conversion.go).
const FIELD_LABEL_CONVERSIONS: &[(&str, &str)] = &[
    ("reason", "reason"),
    ("regarding.kind", "involvedObject.kind"),
    ("regarding.namespace", "involvedObject.namespace"),
    ("regarding.name", "involvedObject.name"),
    ("regarding.uid", "involvedObject.uid"),
    ("regarding.apiVersion", "involvedObject.apiVersion"),
    ("regarding.resourceVersion", "involvedObject.resourceVersion"),
    ("regarding.fieldPath", "involvedObject.fieldPath"),
    ("reportingController", "reportingComponent"),
    ("source", "source"),
    ("type", "type"),
];

/// [`FIELD_LABEL_CONVERSIONS`]' own labels.
const FIELD_LABELS: &[&str] = &[
    "reason",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reportingController",
    "source",
    "type",
];

impl From<CoreEvent> for Event {
    /// `Convert_core_Event_To_v1_Event`.
    fn from(e: CoreEvent) -> Self {
        Event {
            metadata: e.metadata,
            event_time: e.event_time,
            series: e
                .series
                .map(|s| EventSeries { count: s.count.unwrap_or(0), last_observed_time: s.last_observed_time }),
            reporting_controller: e.reporting_component,
            reporting_instance: e.reporting_instance,
            action: e.action,
            reason: e.reason,
            regarding: Some(e.involved_object),
            related: e.related,
            note: e.message,
            type_: e.type_,
            deprecated_source: e.source,
            deprecated_first_timestamp: e.first_timestamp,
            deprecated_last_timestamp: e.last_timestamp,
            deprecated_count: e.count,
        }
    }
}

impl From<Event> for CoreEvent {
    /// `Convert_v1_Event_To_core_Event`.
    fn from(e: Event) -> Self {
        CoreEvent {
            metadata: e.metadata,
            involved_object: e.regarding.unwrap_or_default(),
            reason: e.reason,
            message: e.note,
            source: e.deprecated_source,
            first_timestamp: e.deprecated_first_timestamp,
            last_timestamp: e.deprecated_last_timestamp,
            count: e.deprecated_count,
            type_: e.type_,
            event_time: e.event_time,
            series: e.series.map(|s| k8s_openapi::api::core::v1::EventSeries {
                count: Some(s.count),
                last_observed_time: s.last_observed_time,
            }),
            action: e.action,
            related: e.related,
            reporting_component: e.reporting_controller,
            reporting_instance: e.reporting_instance,
        }
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
    fn stored_as() -> Option<StoredAs<Self>> {
        Some(StoredAs::converted::<CoreEvent>())
    }
    /// The strict validation of the new API, on the core form (so the fields are named as kube-apiserver names
    /// them: `reportingController`, `eventTime`, `involvedObject.namespace`, ...).
    fn validate(&self) -> Vec<FieldError> {
        CoreEvent::from(self.clone()).validate_strict_create()
    }
    /// `ValidateEventCreate` puts `ValidateObjectMeta` after the legacy checks.
    fn validate_with_meta(&self, meta: Vec<FieldError>) -> Vec<FieldError> {
        CoreEvent::from(self.clone()).validate_strict_create_with(meta)
    }
    fn validate_update(&self, old: &Self) -> Vec<FieldError> {
        CoreEvent::from(self.clone()).validate_strict_update(&CoreEvent::from(old.clone()))
    }
    const NAME_AND_AGE_COLUMNS: bool = false;
    /// kube-apiserver prints events.k8s.io Events with the core Event printer.
    fn columns() -> Vec<Column> {
        CoreEvent::columns()
    }
    fn cells(&self, now: chrono::DateTime<chrono::Utc>) -> Vec<Value> {
        CoreEvent::from(self.clone()).cells(now)
    }
    const FIELD_LABELS: &'static [&'static str] = FIELD_LABELS;
    /// The core form's selectable fields under this version's labels.
    fn selectable_fields(&self) -> Vec<(&'static str, String)> {
        let core = CoreEvent::from(self.clone()).core_selectable_fields();
        FIELD_LABEL_CONVERSIONS
            .iter()
            .filter_map(|(label, core_label)| {
                core.iter().find(|(l, _)| l == core_label).map(|(_, value)| (*label, value.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every field has its place in the other version: core -> events.k8s.io -> core is the identity, and each
    /// renamed field lands where pkg/apis/events/v1/conversion.go puts it.
    #[test]
    fn conversion_round_trips_and_renames() {
        let core: CoreEvent = serde_json::from_value(json!({
            "metadata": {"name": "e", "namespace": "default"},
            "involvedObject": {"kind": "StorageVersionMigration", "name": "m", "uid": "u", "fieldPath": "spec"},
            "reason": "R", "message": "M", "source": {"component": "c", "host": "h"},
            "firstTimestamp": "2026-11-21T03:00:00Z", "lastTimestamp": "2026-11-21T03:01:00Z", "count": 2,
            "type": "Warning", "eventTime": "2026-11-21T03:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-11-21T03:02:00.000000Z"}, "action": "A",
            "related": {"kind": "Pod", "name": "p"}, "reportingComponent": "rc", "reportingInstance": "ri",
        }))
        .expect("a core Event");
        let new = Event::from(core.clone());
        let v = serde_json::to_value(&new).expect("encode");
        assert_eq!(v["regarding"]["uid"], "u");
        assert_eq!((v["note"].as_str(), v["reportingController"].as_str()), (Some("M"), Some("rc")));
        assert_eq!(v["deprecatedSource"], json!({"component": "c", "host": "h"}));
        assert_eq!(v["deprecatedFirstTimestamp"], "2026-11-21T03:00:00Z");
        assert_eq!(v["deprecatedLastTimestamp"], "2026-11-21T03:01:00Z");
        assert_eq!((v["deprecatedCount"].as_i64(), v["series"]["count"].as_i64()), (Some(2), Some(3)));
        assert_eq!(CoreEvent::from(new.clone()), core);
        let fields = new.selectable_fields();
        let field = |label: &str| fields.iter().find(|(l, _)| *l == label).map(|(_, v)| v.as_str());
        assert_eq!(
            (field("regarding.uid"), field("reportingController"), field("source")),
            (Some("u"), Some("rc"), Some("c"))
        );
        assert_eq!(fields.len(), FIELD_LABELS.len());
    }

    /// k8s.io/api/events/v1 Event: `series` is a pointer, its `count` and `lastObservedTime` values (zero when
    /// missing or `null`, then reported by the new API's validation); `regarding` a struct value.
    #[test]
    fn missing_and_null_fields_decode_as_go() {
        let e: Event = serde_json::from_value(json!({
            "metadata": {"name": "e", "namespace": "default"}, "eventTime": "2026-11-21T03:00:00.000000Z",
            "series": {"count": null, "lastObservedTime": null}, "regarding": null, "reportingController": "c",
            "reportingInstance": "i", "action": "A", "reason": "R", "type": "Normal",
        }))
        .expect("decodes");
        assert_eq!(e.series, Some(EventSeries::default()));
        let fields: Vec<String> = e.validate().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["series.count", "series.lastObservedTime"]);
        let e: Event = serde_json::from_value(json!({"metadata": null, "series": null})).expect("decodes");
        assert_eq!(e, Event::default());
    }
}
