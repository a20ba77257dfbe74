//! Decoding `status.conditions` as Go decodes a `[]metav1.Condition`: a field that is missing or `null` is its zero
//! value (an empty string, the zero time), never a decode error. Validation then answers for it, as upstream does: a
//! 422 naming `status.conditions[i].lastTransitionTime: Required value` beside every other error of the object,
//! where a strict decoder would answer 400 `missing field lastTransitionTime` alone.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Deserializer};

/// Go's zero `time.Time` (0001-01-01T00:00:00Z), in Unix seconds: what an unset `metav1.Time` is.
pub(super) const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;

/// A metav1.Condition with every field optional, as the wire may carry it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WireCondition {
    #[serde(rename = "type", default)]
    type_: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    observed_generation: Option<i64>,
    #[serde(default)]
    last_transition_time: Option<Time>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

fn go_zero_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(GO_ZERO_TIME_SECONDS).unwrap_or_default())
}

/// `deserialize_with` for `status.conditions` (a missing or `null` list is empty, as for Go).
pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    let wire: Option<Vec<Option<WireCondition>>> = Option::deserialize(d)?;
    Ok(wire
        .unwrap_or_default()
        .into_iter()
        .map(|c| {
            let c = c.unwrap_or_default();
            Condition {
                type_: c.type_.unwrap_or_default(),
                status: c.status.unwrap_or_default(),
                observed_generation: c.observed_generation,
                last_transition_time: c.last_transition_time.unwrap_or_else(go_zero_time),
                reason: c.reason.unwrap_or_default(),
                message: c.message.unwrap_or_default(),
            }
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
        assert_eq!(s.conditions[0].last_transition_time.0.as_second(), super::GO_ZERO_TIME_SECONDS);
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
}
