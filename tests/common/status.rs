//! Reading what the server answers: the causes of a failure `Status`, and the conditions in an object's status.

use serde_json::Value;

/// The `field` of each cause of a failure `Status`, in order (none when it has no causes).
pub fn cause_fields(status: &Value) -> Vec<String> {
    cause_pairs(status).into_iter().map(|(_, field)| field).collect()
}

/// The (`reason`, `field`) of each cause of a failure `Status`, in order (none when it has no causes).
pub fn cause_pairs(status: &Value) -> Vec<(String, String)> {
    let text = |c: &Value, key: &str| c[key].as_str().unwrap_or_default().to_string();
    status["details"]["causes"]
        .as_array()
        .map(|a| a.iter().map(|c| (text(c, "reason"), text(c, "field"))).collect())
        .unwrap_or_default()
}

/// The first condition of `type_` in an object's status, or `null`.
pub fn condition<'a>(object: &'a Value, type_: &str) -> &'a Value {
    object["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// Whether the object's condition of `type_` is True.
pub fn is_true(object: &Value, type_: &str) -> bool {
    condition(object, type_)["status"] == "True"
}

/// The strings of a JSON array (none when it is not one).
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// The (name, priority) of each column of a `Table` (priority -1 when it has none).
pub fn table_columns(table: &Value) -> Vec<(String, i64)> {
    table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| (c["name"].as_str().unwrap_or_default().to_string(), c["priority"].as_i64().unwrap_or(-1)))
        .collect()
}
