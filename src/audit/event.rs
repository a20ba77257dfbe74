//! The audit event (`audit.k8s.io/v1` `Event`) with its JSON encoding (fields in Go's order) and the log backend's
//! legacy one-line format (k8s.io/apiserver `pkg/audit/format.go`).
//!
//! Request and response bodies are kept as the bytes the request carried ([`Payload`]) and decoded only when the
//! event is encoded: in batch mode that is the writer's thread, off the request path.

use super::policy::{Level, Stage};
use crate::auth::authn::UserInfo;
use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Clone, Debug)]
pub struct Event {
    pub level: Level,
    pub audit_id: String,
    pub stage: Stage,
    pub request_uri: String,
    pub verb: String,
    /// Empty (`{}`) when authentication failed.
    pub user: Option<UserInfo>,
    /// Filled from the impersonation filter's [`super::ImpersonatedUser`].
    pub impersonated_user: Option<UserInfo>,
    pub source_ips: Vec<String>,
    pub user_agent: String,
    pub object_ref: Option<ObjectReference>,
    pub response_status: Option<ResponseStatus>,
    pub request_object: Option<Payload>,
    pub response_object: Option<Payload>,
    pub request_received: DateTime<Utc>,
    pub stage_timestamp: DateTime<Utc>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub subresource: String,
}

/// The `metav1.Status` of `responseStatus`: the code, and for a `Status` answer its status, message, reason and
/// details (what `LogResponseObject` copies).
#[derive(Clone, Debug, Default)]
pub struct ResponseStatus {
    pub code: u16,
    pub status: String,
    pub message: String,
    pub reason: String,
    pub details: Option<Value>,
}

impl ResponseStatus {
    /// The code, with the fields of `body` when it is a `Status`.
    pub fn from_answer(code: u16, body: Option<&Value>) -> ResponseStatus {
        let mut status = ResponseStatus { code, ..Default::default() };
        if let Some(s) = body.filter(|b| b["kind"] == "Status") {
            let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
            status.status = text("status");
            status.message = text("message");
            status.reason = text("reason");
            status.details = s.get("details").filter(|d| !d.is_null()).cloned();
            if let Some(c) = s["code"].as_u64() {
                status.code = c as u16;
            }
        }
        status
    }
}

impl Serialize for ResponseStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("metadata", &serde_json::Map::new())?;
        for (k, v) in [("status", &self.status), ("message", &self.message), ("reason", &self.reason)] {
            if !v.is_empty() {
                m.serialize_entry(k, v)?;
            }
        }
        if let Some(d) = &self.details {
            m.serialize_entry("details", d)?;
        }
        if self.code != 0 {
            m.serialize_entry("code", &self.code)?;
        }
        m.end()
    }
}

/// A request or response body as it was sent, decoded when the event is encoded.
#[derive(Clone, Debug)]
pub struct Payload {
    pub bytes: Bytes,
    /// JSON, or YAML (the body of a YAML create or apply patch), logged as JSON as upstream transcodes it.
    pub yaml: bool,
    /// `omitManagedFields`: metadata.managedFields is dropped from the object, or from each item of a list.
    pub omit_managed_fields: bool,
}

impl Payload {
    /// The body as JSON; None when it is neither JSON nor YAML (upstream rejects such a body before logging it).
    pub fn decode(&self) -> Option<Value> {
        let mut v: Value = match serde_json::from_slice(&self.bytes) {
            Ok(v) => v,
            Err(_) if self.yaml => serde_yaml_ng::from_slice(&self.bytes).ok()?,
            Err(_) => return None,
        };
        if self.omit_managed_fields {
            drop_managed_fields(&mut v);
        }
        Some(v)
    }
}

fn drop_managed_fields(v: &mut Value) {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(drop_managed_fields);
    }
    // A Table's rows carry their objects (includeObject=Object).
    if let Some(rows) = v.get_mut("rows").and_then(Value::as_array_mut) {
        for row in rows {
            if let Some(o) = row.get_mut("object") {
                drop_managed_fields(o);
            }
        }
    }
}

/// An event ready to encode: bodies decoded, the request object's identity completed into objectRef.
pub struct Encodable<'a> {
    event: &'a Event,
    /// The event's own, or a copy completed from the request object.
    object_ref: Option<Cow<'a, ObjectReference>>,
    request_object: Option<Value>,
    response_object: Option<Value>,
    /// `kind` and `apiVersion`: written for an event on its own (a log line), not for an item of an `EventList`
    /// (kube-apiserver's webhook batches carry them once, on the list).
    type_meta: bool,
}

impl Event {
    /// Decodes the bodies. `fill_ref`: for a create or update, objectRef takes the name, namespace, uid and
    /// resourceVersion it lacks from the request object, as `LogRequestObject` does (at every level).
    pub fn encodable(&self, fill_ref: bool) -> Encodable<'_> {
        let request = self.request_object.as_ref().and_then(Payload::decode);
        let mut object_ref = self.object_ref.as_ref().map(Cow::Borrowed);
        if let (true, Some(r), Some(meta)) = (fill_ref, object_ref.as_mut(), request.as_ref().map(|o| &o["metadata"])) {
            let r = r.to_mut();
            let fill = |field: &mut String, key: &str| {
                if field.is_empty() {
                    *field = meta[key].as_str().unwrap_or_default().to_string();
                }
            };
            fill(&mut r.namespace, "namespace");
            fill(&mut r.name, "name");
            fill(&mut r.uid, "uid");
            fill(&mut r.resource_version, "resourceVersion");
        }
        let logged = |l: Level| self.level >= l;
        Encodable {
            event: self,
            object_ref,
            request_object: request.filter(|_| logged(Level::Request)),
            response_object: self
                .response_object
                .as_ref()
                .filter(|_| logged(Level::RequestResponse))
                .and_then(Payload::decode),
            type_meta: true,
        }
    }

    /// An event of `level` at ResponseComplete with nothing else known, for tests to fill in.
    #[cfg(test)]
    pub(crate) fn for_tests(level: super::policy::Level, audit_id: &str, request_uri: &str) -> Event {
        let t = chrono::Utc::now();
        Event {
            level,
            audit_id: audit_id.into(),
            stage: super::policy::Stage::ResponseComplete,
            request_uri: request_uri.into(),
            verb: "get".into(),
            user: None,
            impersonated_user: None,
            source_ips: vec![],
            user_agent: String::new(),
            object_ref: None,
            response_status: None,
            request_object: None,
            response_object: None,
            request_received: t,
            stage_timestamp: t,
            annotations: Default::default(),
        }
    }

    /// One JSON line (with its newline), as the log backend's json format writes it.
    pub fn to_json_line(&self, fill_ref: bool) -> Result<Vec<u8>, serde_json::Error> {
        let mut line = Vec::new();
        self.append_json_line(fill_ref, &mut line)?;
        Ok(line)
    }

    /// [`Event::to_json_line`] appended to `out`.
    pub fn append_json_line(&self, fill_ref: bool, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        serde_json::to_writer(&mut *out, &self.encodable(fill_ref))?;
        out.push(b'\n');
        Ok(())
    }

    /// The legacy format's line (`EventString`), with its newline.
    pub fn to_legacy_line(&self) -> String {
        let q = crate::gostr::quote;
        let slice = |v: &[String]| v.iter().map(|s| q(s)).collect::<Vec<_>>().join(",");
        let (mut username, mut groups) = ("<none>".to_string(), "<none>".to_string());
        if let Some(u) = self.user.as_ref().filter(|u| !u.name.is_empty()) {
            username = u.name.clone();
            if !u.groups.is_empty() {
                groups = slice(&u.groups);
            }
        }
        let (mut asuser, mut asgroups) = ("<self>".to_string(), "<lookup>".to_string());
        if let Some(u) = &self.impersonated_user {
            asuser = u.name.clone();
            asgroups = slice(&u.groups);
        }
        let namespace = self.object_ref.as_ref().map(|r| r.namespace.as_str()).filter(|n| !n.is_empty());
        let response = self.response_status.as_ref().map_or("<deferred>".to_string(), |s| s.code.to_string());
        format!(
            "{} AUDIT: id={} stage={} ip={} method={} user={} groups={} as={} asgroups={} user-agent={} namespace={} uri={} response=\"{}\"\n",
            rfc3339_nano(self.request_received),
            q(&self.audit_id),
            q(self.stage.as_str()),
            q(self.source_ips.first().map_or("<unknown>", String::as_str)),
            q(&self.verb),
            q(&username),
            q(&groups),
            q(&asuser),
            q(&asgroups),
            q(&self.user_agent),
            q(namespace.unwrap_or("<none>")),
            q(&self.request_uri),
            response
        )
    }
}

/// metav1.MicroTime: RFC 3339 in UTC with six fractional digits.
pub fn micro_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Go's time.RFC3339Nano: trailing zeros of the fraction dropped.
fn rfc3339_nano(t: DateTime<Utc>) -> String {
    let s = t.to_rfc3339_opts(SecondsFormat::Nanos, true);
    match s.split_once('.') {
        Some((secs, frac)) => {
            let digits = frac.trim_end_matches('Z').trim_end_matches('0');
            if digits.is_empty() {
                format!("{secs}Z")
            } else {
                format!("{secs}.{digits}Z")
            }
        }
        None => s,
    }
}

/// authentication/v1 `UserInfo`: every field omitted when empty.
struct User<'a>(&'a UserInfo);

impl Serialize for User<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let u = self.0;
        let mut m = s.serialize_map(None)?;
        if !u.name.is_empty() {
            m.serialize_entry("username", &u.name)?;
        }
        if !u.uid.is_empty() {
            m.serialize_entry("uid", &u.uid)?;
        }
        if !u.groups.is_empty() {
            m.serialize_entry("groups", &u.groups)?;
        }
        if !u.extra.is_empty() {
            m.serialize_entry("extra", &u.extra)?;
        }
        m.end()
    }
}

impl Encodable<'_> {
    /// As an item of an `EventList`: without its own `kind` and `apiVersion`.
    pub fn list_item(mut self) -> Self {
        self.type_meta = false;
        self
    }
}

impl Serialize for Encodable<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.event;
        let mut st = s.serialize_struct("Event", 18)?;
        if self.type_meta {
            st.serialize_field("kind", "Event")?;
            st.serialize_field("apiVersion", "audit.k8s.io/v1")?;
        }
        st.serialize_field("level", e.level.as_str())?;
        st.serialize_field("auditID", &e.audit_id)?;
        st.serialize_field("stage", e.stage.as_str())?;
        st.serialize_field("requestURI", &e.request_uri)?;
        st.serialize_field("verb", &e.verb)?;
        let nobody = UserInfo::default();
        st.serialize_field("user", &User(e.user.as_ref().unwrap_or(&nobody)))?;
        if let Some(u) = &e.impersonated_user {
            st.serialize_field("impersonatedUser", &User(u))?;
        }
        if !e.source_ips.is_empty() {
            st.serialize_field("sourceIPs", &e.source_ips)?;
        }
        if !e.user_agent.is_empty() {
            st.serialize_field("userAgent", &e.user_agent)?;
        }
        if let Some(r) = &self.object_ref {
            st.serialize_field("objectRef", r)?;
        }
        if let Some(r) = &e.response_status {
            st.serialize_field("responseStatus", r)?;
        }
        if let Some(o) = &self.request_object {
            st.serialize_field("requestObject", o)?;
        }
        if let Some(o) = &self.response_object {
            st.serialize_field("responseObject", o)?;
        }
        st.serialize_field("requestReceivedTimestamp", &micro_time(e.request_received))?;
        st.serialize_field("stageTimestamp", &micro_time(e.stage_timestamp))?;
        if !e.annotations.is_empty() {
            st.serialize_field("annotations", &e.annotations)?;
        }
        st.end()
    }
}

/// The client's addresses as `utilnet.SourceIPs` lists them: each valid X-Forwarded-For entry, then X-Real-Ip
/// unless already listed, then the connection's remote address unless it is the last one listed.
pub fn source_ips(headers: &axum::http::HeaderMap, remote: Option<std::net::IpAddr>) -> Vec<String> {
    use std::net::IpAddr;
    let parse = |s: &str| parse_ip_sloppy(s.trim());
    let mut ips: Vec<IpAddr> = Vec::new();
    if let Some(fwd) = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()) {
        ips.extend(fwd.split(',').filter_map(parse));
    }
    if let Some(ip) = headers.get("x-real-ip").and_then(|v| v.to_str().ok()).and_then(parse_ip_sloppy) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    if let Some(ip) = remote.map(|r| r.to_canonical()) {
        if ips.last() != Some(&ip) {
            ips.push(ip);
        }
    }
    ips.iter().map(IpAddr::to_string).collect()
}

/// netutils.ParseIPSloppy: IPv4 parts may have leading zeros (read as decimal); IPv4-mapped IPv6 is IPv4.
fn parse_ip_sloppy(s: &str) -> Option<std::net::IpAddr> {
    if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        return Some(ip.to_canonical());
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 || parts.iter().any(|p| p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(parts) {
        *o = p.parse().ok()?;
    }
    Some(std::net::IpAddr::from(octets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    #[test]
    fn source_ips_as_upstream_lists_them() {
        let remote = Some("10.0.0.9".parse().expect("ip"));
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(*k, v.parse().expect("value"));
            }
            m
        };
        assert_eq!(source_ips(&h(&[]), remote), ["10.0.0.9"]);
        assert_eq!(
            source_ips(&h(&[("x-forwarded-for", " 1.1.1.1, bogus ,2.2.2.2"), ("x-real-ip", "1.1.1.1")]), remote),
            ["1.1.1.1", "2.2.2.2", "10.0.0.9"]
        );
        assert_eq!(source_ips(&h(&[("x-real-ip", "010.000.000.009")]), remote), ["10.0.0.9"]);
        assert_eq!(source_ips(&h(&[("x-forwarded-for", "10.0.0.9")]), remote), ["10.0.0.9"]);
        assert_eq!(source_ips(&h(&[]), Some("::ffff:127.0.0.1".parse().expect("ip"))), ["127.0.0.1"]);
    }

    #[test]
    fn timestamps_as_go_formats_them() {
        let t = DateTime::parse_from_rfc3339("2024-05-06T07:08:09.120000Z").expect("time").with_timezone(&Utc);
        assert_eq!(micro_time(t), "2024-05-06T07:08:09.120000Z");
        assert_eq!(rfc3339_nano(t), "2024-05-06T07:08:09.12Z");
        let whole = DateTime::parse_from_rfc3339("2024-05-06T07:08:09Z").expect("time").with_timezone(&Utc);
        assert_eq!(rfc3339_nano(whole), "2024-05-06T07:08:09Z");
    }

    #[test]
    fn managed_fields_dropped_from_objects_lists_and_tables() {
        let p = |v: Value| Payload { bytes: Bytes::from(v.to_string()), yaml: false, omit_managed_fields: true };
        let obj = serde_json::json!({"metadata": {"name": "a", "managedFields": [{}]}});
        assert_eq!(p(obj).decode().expect("json")["metadata"], serde_json::json!({"name": "a"}));
        let list = serde_json::json!({"items": [{"metadata": {"managedFields": []}}]});
        assert_eq!(p(list).decode().expect("json")["items"][0]["metadata"], serde_json::json!({}));
        let yaml = Payload { bytes: Bytes::from_static(b"a: 1\n"), yaml: true, omit_managed_fields: false };
        assert_eq!(yaml.decode(), Some(serde_json::json!({"a": 1})));
    }
}
