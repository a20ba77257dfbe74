//! Decoding `status.conditions` as Go decodes a `[]metav1.Condition`: a field that is missing or `null` is its zero
//! value (an empty string, the zero time), never a decode error. Validation then answers for it, as upstream does: a
//! 422 naming `status.conditions[i].lastTransitionTime: Required value` beside every other error of the object,
//! where a strict decoder would answer 400 `missing field lastTransitionTime` alone.

use crate::go_decode::{self, zero_time};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Deserializer};

/// A metav1.Condition as the wire may carry it: its strings Go's values, its time optional here only because Go's
/// zero time is not Rust's [`Default`] (k8s-openapi's `Condition` wants one, and its decoder a present one).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", expecting = "struct Condition")]
struct WireCondition {
    #[serde(rename = "type", default, deserialize_with = "go_decode::null_as_default")]
    type_: String,
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    status: String,
    #[serde(default)]
    observed_generation: Option<i64>,
    #[serde(default)]
    last_transition_time: Option<Time>,
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    reason: String,
    #[serde(default, deserialize_with = "go_decode::null_as_default")]
    message: String,
}

/// `deserialize_with` for `status.conditions` (a missing or `null` list is empty, a `null` entry a zero condition).
pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    Ok(go_decode::list::<D, WireCondition>(d)?
        .into_iter()
        .map(|c| Condition {
            type_: c.type_,
            status: c.status,
            observed_generation: c.observed_generation,
            last_transition_time: c.last_transition_time.unwrap_or_else(zero_time),
            reason: c.reason,
            message: c.message,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::StorageVersionMigrationStatus;
    use serde_json::json;

    #[test]
    fn missing_and_null_fields_decode_to_go_zero_values() {
        let s: StorageVersionMigrationStatus = serde_json::from_value(json!({"conditions": [
            {"type": "Running", "status": "True"},
            {"type": "Failed", "lastTransitionTime": null, "reason": null, "message": null},
            null,
        ]}))
        .expect("decodes");
        assert_eq!(s.conditions.len(), 3);
        assert_eq!(s.conditions[0].last_transition_time.0.as_second(), crate::go_decode::GO_ZERO_TIME_SECONDS);
        assert_eq!((s.conditions[1].reason.as_str(), s.conditions[1].status.as_str()), ("", ""));
        assert_eq!(s.conditions[2].type_, "");
        let none: StorageVersionMigrationStatus = serde_json::from_value(json!({"conditions": null})).expect("decodes");
        assert!(none.conditions.is_empty());
        // A value of the wrong type is still a decode error, as in Go.
        assert!(serde_json::from_value::<StorageVersionMigrationStatus>(
            json!({"conditions": [{"lastTransitionTime": "yesterday"}]})
        )
        .is_err());
    }

    /// The rest of the kind (staging/src/k8s.io/api/storagemigration/v1/types.go): metadata, spec, its
    /// GroupResource and status.resourceVersion are Go values too.
    #[test]
    fn the_whole_object_decodes_as_go() {
        let m: super::super::StorageVersionMigration = serde_json::from_value(json!({
            "metadata": null, "spec": {"resource": {"group": null, "resource": null}},
            "status": {"resourceVersion": null, "conditions": null},
        }))
        .expect("decodes");
        assert_eq!(m.spec, Default::default());
        assert_eq!(m.status, Some(Default::default()));
        let m: super::super::StorageVersionMigration = serde_json::from_value(json!({"spec": null})).expect("decodes");
        assert_eq!(m, Default::default());
    }
}
