//! Limits on the requests in flight, as kube-apiserver's max-in-flight filter sets them
//! (k8s.io/apiserver `pkg/server/filters/maxinflight.go`): `--max-requests-inflight` for reads (get, list, and a
//! non-resource GET) and `--max-mutating-requests-inflight` for everything else, each 0 for no limit. Above a
//! limit the request is answered at once, never queued, with the filter's 429 ([`too_many_requests`]).
//!
//! As API Priority and Fairness charges it (`pkg/util/flowcontrol/request/list_work_estimator.go`), a LIST takes
//! one seat per 100 objects it will return, at least 1 and at most 10 (or the whole limit when that is smaller), so
//! that a few huge LISTs cannot crowd out many small reads: a second huge LIST gets 429 while GETs still pass.
//! The seats are held until the answer's last byte is sent.
//!
//! Not counted, as upstream does not count them: long-running requests (watches); requests of `system:masters`
//! (APF's exempt priority level); and the scheduler's in-process requests, which are this server's own work.

use super::metrics::{Label, RequestKindLabel, TerminationLabelSet};
use super::AppState;
use crate::auth::authn::UserInfo;
use crate::request_info::RequestInfo;
use axum::body::Body;
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// kube-apiserver's defaults of `--max-requests-inflight` and `--max-mutating-requests-inflight`.
pub const DEFAULT_MAX_REQUESTS_INFLIGHT: u32 = 400;
pub const DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT: u32 = 200;

/// APF's count-based LIST width: objects per seat, and the most seats one LIST takes.
const OBJECTS_PER_SEAT: u64 = 100;
const MAX_LIST_SEATS: u64 = 10;

/// The group whose requests are never limited (APF's exempt FlowSchema).
const SYSTEM_MASTERS: &str = "system:masters";

/// The filter's answer above a limit: its text, sent by Go's `http.Error` (which appends the newline).
pub const TOO_MANY_REQUESTS: &str = "Too many requests, please try again later.\n";

/// Which limit a request counts against, named as `apiserver_current_inflight_requests{request_kind}` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    ReadOnly,
    Mutating,
}

impl RequestKind {
    /// Upstream's rule: get, list and watch read; every other verb mutates, including a non-resource request's
    /// method other than GET (its verb is the lower-case method).
    pub fn of(info: &RequestInfo) -> Self {
        match info.verb.as_str() {
            "get" | "list" | "watch" => RequestKind::ReadOnly,
            _ => RequestKind::Mutating,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            RequestKind::ReadOnly => "readOnly",
            RequestKind::Mutating => "mutating",
        }
    }
}

/// One limit: its seats, and the most in use since the metric last read it.
struct Pool {
    seats: Arc<Semaphore>,
    limit: u32,
    peak: AtomicU64,
}

impl Pool {
    fn new(limit: u32) -> Option<Pool> {
        (limit > 0).then(|| Pool { seats: Arc::new(Semaphore::new(limit as usize)), limit, peak: AtomicU64::new(0) })
    }

    fn in_use(&self) -> u64 {
        u64::from(self.limit) - self.seats.available_permits() as u64
    }
}

/// What the limits decided for a request.
pub enum Admission {
    /// Served without taking seats (no limit, long-running, exempt).
    Uncounted,
    /// Served; the seats are the request's until dropped.
    Admitted(OwnedSemaphorePermit),
    /// Over the limit: answer [`too_many_requests`].
    Rejected,
}

/// The two limits of one server.
pub struct InflightLimits {
    read_only: Option<Pool>,
    mutating: Option<Pool>,
}

impl Default for InflightLimits {
    fn default() -> Self {
        InflightLimits::new(DEFAULT_MAX_REQUESTS_INFLIGHT, DEFAULT_MAX_MUTATING_REQUESTS_INFLIGHT)
    }
}

impl InflightLimits {
    /// Limits of `read_only` and `mutating` requests in flight; 0 for none.
    pub fn new(read_only: u32, mutating: u32) -> Self {
        InflightLimits { read_only: Pool::new(read_only), mutating: Pool::new(mutating) }
    }

    fn pool(&self, kind: RequestKind) -> Option<&Pool> {
        match kind {
            RequestKind::ReadOnly => self.read_only.as_ref(),
            RequestKind::Mutating => self.mutating.as_ref(),
        }
    }

    /// Whether `info` from `user` is counted at all: watches are long-running, `system:masters` is exempt.
    pub fn counts(info: &RequestInfo, user: &UserInfo) -> bool {
        info.verb != "watch" && !user.groups.iter().any(|g| g == SYSTEM_MASTERS)
    }

    /// Takes `seats` of the limit of `kind` (clamped to 1..=limit, so that any request fits an idle server), or
    /// rejects the request when they are not free now.
    pub fn admit(&self, kind: RequestKind, seats: u64) -> Admission {
        let Some(pool) = self.pool(kind) else { return Admission::Uncounted };
        let seats = seats.clamp(1, u64::from(pool.limit)) as u32;
        match pool.seats.clone().try_acquire_many_owned(seats) {
            Ok(permit) => {
                pool.peak.fetch_max(pool.in_use(), Ordering::Relaxed);
                Admission::Admitted(permit)
            }
            Err(_) => Admission::Rejected,
        }
    }

    /// The most seats in use of each limit since the last call (`apiserver_current_inflight_requests` shows the
    /// peak of each second), starting the next period at what is in use now.
    pub fn take_peaks(&self) -> Vec<(RequestKind, u64)> {
        [RequestKind::ReadOnly, RequestKind::Mutating]
            .into_iter()
            .map(|kind| match self.pool(kind) {
                Some(pool) => (kind, pool.peak.swap(pool.in_use(), Ordering::Relaxed).max(pool.in_use())),
                None => (kind, 0),
            })
            .collect()
    }
}

/// Sets `apiserver_current_inflight_requests` every second to the peak of the second before, as upstream's filter
/// does; ends with the server.
pub async fn publish_peaks(state: Weak<AppState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(st) = state.upgrade() else { return };
        for (kind, peak) in st.inflight.take_peaks() {
            let label = RequestKindLabel { request_kind: kind.label() };
            st.metrics.current_inflight.get_or_create(&label).set(peak as i64);
        }
    }
}

/// The seats a LIST that returns up to `limit` objects (0: all) out of `count` takes; a LIST of one named object
/// (`fieldSelector=metadata.name=...`) takes one.
pub fn list_seats(count: Option<u64>, limit: u64, one_name: bool) -> u64 {
    if one_name {
        return 1;
    }
    // A count the store cannot give is charged the least, as APF charges a resource it has no count of.
    let Some(count) = count else { return 1 };
    let objects = if limit > 0 { limit.min(count) } else { count };
    objects.div_ceil(OBJECTS_PER_SEAT).clamp(1, MAX_LIST_SEATS)
}

/// The max-in-flight filter's 429: `Retry-After: 1` and its plain-text body, as Go's `http.Error` sends it.
pub fn too_many_requests() -> Response {
    let mut r = (StatusCode::TOO_MANY_REQUESTS, TOO_MANY_REQUESTS).into_response();
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("retry-after", HeaderValue::from_static("1"));
    r
}

/// `resp` with `seats` held until its body has been sent (or dropped with the connection).
pub fn holding(resp: Response, seats: OwnedSemaphorePermit) -> Response {
    resp.map(|body| Body::new(Holding { body, _seats: seats }))
}

struct Holding {
    body: Body,
    _seats: OwnedSemaphorePermit,
}

impl hyper::body::Body for Holding {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The seats `req` takes of its in-flight limit (None: not counted), or the 429 that rejects it, labelled for
/// the request metrics as the request it answers.
pub(super) async fn admit(
    st: &AppState,
    info: Option<&RequestInfo>,
    method: &Method,
    uri: &Uri,
    user: &UserInfo,
) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Box<Response>> {
    let Some(info) = info else { return Ok(None) };
    if !InflightLimits::counts(info, user) {
        return Ok(None);
    }
    let kind = RequestKind::of(info);
    // Counting a LIST's objects costs a read: only where there is a limit to charge them against.
    let seats = match info.verb.as_str() {
        "list" if st.inflight.pool(kind).is_some() => seats_of_list(st, info, uri.query()).await,
        _ => 1,
    };
    match st.inflight.admit(kind, seats) {
        Admission::Uncounted => Ok(None),
        Admission::Admitted(seats) => Ok(Some(seats)),
        Admission::Rejected => {
            let mut resp = too_many_requests();
            let labels = super::rest::RequestLabels::of_request(info);
            st.metrics.record_termination(termination_labels(&labels, method, uri.path(), info));
            resp.extensions_mut().insert(labels);
            Err(Box::new(resp))
        }
    }
}

/// `apiserver_request_terminations_total`'s labels of a rejected request: a non-resource request's verb is its
/// method and its path stands in the subresource label, as upstream's `RecordRequestTermination` writes them.
fn termination_labels(
    labels: &super::rest::RequestLabels,
    method: &Method,
    path: &str,
    info: &RequestInfo,
) -> TerminationLabelSet {
    let owned = |s: &str| Label::Owned(s.to_string());
    let (verb, subresource) = match info.is_resource_request {
        true => (Label::Borrowed(labels.verb), owned(&labels.subresource)),
        false => (owned(method.as_str()), owned(path)),
    };
    TerminationLabelSet {
        verb,
        group: owned(&labels.group),
        version: owned(&labels.version),
        resource: owned(&labels.resource),
        subresource,
        scope: Label::Borrowed(labels.scope),
        component: Label::Borrowed("apiserver"),
        code: Label::Borrowed("429"),
    }
}

/// A LIST's seats, by the objects it will return: its `limit`, or all the store holds of it (one for a
/// `fieldSelector` naming one object).
async fn seats_of_list(st: &AppState, info: &RequestInfo, query: Option<&str>) -> u64 {
    let mut limit = 0;
    let mut one_name = false;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => limit = v.parse().unwrap_or(0),
            "fieldSelector" => one_name = v.split(',').any(|s| s.trim().starts_with("metadata.name=")),
            _ => {}
        }
    }
    let namespace = (!info.namespace.is_empty()).then_some(info.namespace.as_str());
    let count = match st.registry.resource(&info.api_group, &info.api_version, &info.resource) {
        Some(res) => res.count(namespace).await.ok(),
        None => None,
    };
    list_seats(count, limit, one_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path: &str, query: Option<&str>) -> RequestInfo {
        RequestInfo::parse(&method.parse().expect("method"), path, query)
    }

    #[test]
    fn reads_are_get_list_and_watch_everything_else_mutates() {
        let cases = [
            ("GET", "/apis/migration.k8s.io/v1alpha1/storagestates", None, RequestKind::ReadOnly),
            ("GET", "/apis/migration.k8s.io/v1alpha1/storagestates/x", None, RequestKind::ReadOnly),
            ("GET", "/apis/migration.k8s.io/v1alpha1/storagestates", Some("watch=true"), RequestKind::ReadOnly),
            ("GET", "/metrics", None, RequestKind::ReadOnly),
            ("HEAD", "/metrics", None, RequestKind::Mutating),
            ("POST", "/apis/migration.k8s.io/v1alpha1/storagestates", None, RequestKind::Mutating),
            ("DELETE", "/apis/migration.k8s.io/v1alpha1/storagestates", None, RequestKind::Mutating),
            ("PATCH", "/apis/migration.k8s.io/v1alpha1/storagestates/x/status", None, RequestKind::Mutating),
        ];
        for (method, path, query, kind) in cases {
            assert_eq!(RequestKind::of(&info(method, path, query)), kind, "{method} {path} {query:?}");
        }
    }

    #[test]
    fn a_list_takes_a_seat_per_hundred_objects_up_to_ten() {
        assert_eq!(list_seats(Some(0), 0, false), 1);
        assert_eq!(list_seats(Some(100), 0, false), 1);
        assert_eq!(list_seats(Some(101), 0, false), 2);
        assert_eq!(list_seats(Some(10_000), 0, false), 10);
        assert_eq!(list_seats(Some(10_000), 500, false), 5);
        assert_eq!(list_seats(Some(30), 500, false), 1);
        assert_eq!(list_seats(Some(10_000), 0, true), 1);
        assert_eq!(list_seats(None, 0, false), 1);
    }

    #[test]
    fn over_the_limit_a_request_is_rejected_and_seats_come_back_when_dropped() {
        let limits = InflightLimits::new(15, 0);
        let Admission::Admitted(huge) = limits.admit(RequestKind::ReadOnly, 10) else { panic!("first LIST") };
        assert!(matches!(limits.admit(RequestKind::ReadOnly, 10), Admission::Rejected), "second huge LIST");
        let Admission::Admitted(get) = limits.admit(RequestKind::ReadOnly, 1) else { panic!("a GET") };
        assert!(matches!(limits.admit(RequestKind::Mutating, 1), Admission::Uncounted), "no mutating limit");
        assert_eq!(limits.take_peaks(), [(RequestKind::ReadOnly, 11), (RequestKind::Mutating, 0)]);
        drop((huge, get));
        // The peak of the period that just ended, then what is in use.
        assert_eq!(limits.take_peaks(), [(RequestKind::ReadOnly, 11), (RequestKind::Mutating, 0)]);
        assert_eq!(limits.take_peaks(), [(RequestKind::ReadOnly, 0), (RequestKind::Mutating, 0)]);
        // A LIST wider than the whole limit still runs on an idle server.
        let small = InflightLimits::new(4, 4);
        assert!(matches!(small.admit(RequestKind::ReadOnly, 10), Admission::Admitted(_)));
    }

    #[test]
    fn watches_and_system_masters_are_not_counted() {
        let user = |groups: &[&str]| UserInfo {
            name: "u".into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        let list = info("GET", "/apis/migration.k8s.io/v1alpha1/storagestates", None);
        let watch = info("GET", "/apis/migration.k8s.io/v1alpha1/storagestates", Some("watch=1"));
        assert!(InflightLimits::counts(&list, &user(&["system:authenticated"])));
        assert!(!InflightLimits::counts(&watch, &user(&["system:authenticated"])));
        assert!(!InflightLimits::counts(&list, &user(&["system:masters", "system:authenticated"])));
    }
}
