//! The query parameters of a REST request, typed, and decoded as kube-apiserver's parameter codec decodes them:
//! the first value of a repeated parameter counts (every value of `dryRun`, a list), integers are int64 with Go's
//! `strconv.ParseInt` errors, and a boolean is false only for "", "0" and "false" (any case).

use crate::error::{ApiError, ApiResult};
use crate::registry::selectors::{FieldSelector, LabelSelector};
use crate::registry::ListParams;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct QueryParams {
    #[serde(deserialize_with = "go_bool")]
    pub watch: bool,
    pub label_selector: String,
    pub field_selector: String,
    #[serde(deserialize_with = "go_int64")]
    pub limit: Option<i64>,
    #[serde(rename = "continue")]
    pub continue_token: String,
    pub resource_version: Option<String>,
    pub resource_version_match: String,
    #[serde(deserialize_with = "go_int64")]
    pub timeout_seconds: Option<i64>,
    #[serde(deserialize_with = "go_bool")]
    pub allow_watch_bookmarks: bool,
    #[serde(deserialize_with = "go_optional_bool")]
    pub send_initial_events: Option<bool>,
    pub include_object: Option<String>,
    pub dry_run: Vec<String>,
    pub field_validation: Option<String>,
    pub field_manager: String,
    /// Apply only: take the fields of other managers on conflict.
    #[serde(deserialize_with = "go_optional_bool")]
    pub force: Option<bool>,
    pub propagation_policy: Option<String>,
    #[serde(deserialize_with = "go_bool")]
    pub ignore_store_read_error_with_cluster_breaking_potential: bool,
}

impl QueryParams {
    /// Decodes a raw query string; a value that does not convert (an integer that is not one) is a 400 with Go's
    /// conversion error, as kube-apiserver answers it.
    pub fn parse(query: Option<&str>) -> ApiResult<Self> {
        let mut fields = Map::new();
        for (key, value) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            let value = Value::String(value.into_owned());
            if key == "dryRun" {
                if let Value::Array(values) = fields.entry(key.into_owned()).or_insert_with(|| Value::Array(Vec::new()))
                {
                    values.push(value);
                }
            } else {
                fields.entry(key.into_owned()).or_insert(value);
            }
        }
        serde_json::from_value(Value::Object(fields)).map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// The list parameters: selectors parsed (`field_labels`: those the kind adds to metadata's), a limit of 0 or
    /// less meaning none.
    pub fn list_params(&self, field_labels: &[&str]) -> ApiResult<ListParams> {
        let non_empty = |s: &String| (!s.is_empty()).then(|| s.clone());
        Ok(ListParams {
            label_selector: LabelSelector::parse(&self.label_selector)?,
            field_selector: FieldSelector::parse(&self.field_selector, field_labels)?,
            limit: self.limit.and_then(|l| usize::try_from(l).ok()).unwrap_or(0),
            continue_token: non_empty(&self.continue_token),
            resource_version: self.resource_version.clone(),
            resource_version_match: non_empty(&self.resource_version_match),
        })
    }
}

fn go_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    String::deserialize(d).map(|s| crate::request_info::query_bool(&s))
}

fn go_optional_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    go_bool(d).map(Some)
}

fn go_int64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<i64>().map(Some).map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        serde::de::Error::custom(format!("strconv.ParseInt: parsing {s:?}: {why}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_as_kube_apiserver_does() {
        let q = QueryParams::parse(Some(
            "watch=yes&limit=5&limit=7&dryRun=All&dryRun=x&labelSelector=a%3Db&continue=c&timeoutSeconds=-3\
             &allowWatchBookmarks=False&sendInitialEvents=&unknown=1",
        ))
        .unwrap();
        assert!(q.watch, "anything but \"\", 0 and false is true");
        assert_eq!(q.limit, Some(5), "the first value counts");
        assert_eq!(q.dry_run, ["All", "x"], "every dryRun value");
        assert_eq!((q.label_selector.as_str(), q.continue_token.as_str()), ("a=b", "c"));
        assert_eq!(q.timeout_seconds, Some(-3));
        assert!(!q.allow_watch_bookmarks);
        assert_eq!(q.send_initial_events, Some(false));
        assert_eq!(QueryParams::parse(None).unwrap(), QueryParams::default());
        for (query, message) in [
            ("limit=abc", "strconv.ParseInt: parsing \"abc\": invalid syntax"),
            (
                "timeoutSeconds=18446744073709551615",
                "strconv.ParseInt: parsing \"18446744073709551615\": value out of range",
            ),
            ("limit=-9223372036854775809", "strconv.ParseInt: parsing \"-9223372036854775809\": value out of range"),
        ] {
            let e = QueryParams::parse(Some(query)).unwrap_err();
            assert_eq!((e.code, e.message.as_str()), (400, message), "{query}");
        }
        for falsy in ["watch=0", "watch=false", "watch=FALSE", "watch="] {
            assert!(!QueryParams::parse(Some(falsy)).unwrap().watch, "{falsy}");
        }
    }
}
