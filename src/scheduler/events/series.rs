//! Which recorded events are written, and how: the deduplication of client-go's `tools/events` broadcaster
//! (k8s.io/client-go/tools/events/event_broadcaster.go, `recordToSink`, `finishSeries`,
//! `refreshExistingEventSeries`, `getKey`), as a pure cache that the writer task drives with the clock.
//!
//! An event isomorphic to a cached one (same type, action, reason, reportingController, reportingInstance,
//! regarding and related: the note is not part of the key) does not become a new Event. Its first repetition turns the cached one into a series
//! (count 2), written at once as a patch of `series`; later repetitions only count, and reach the server with the
//! heartbeat (every 30 minutes) or when the series ends. A series ends, and is written one last time, once nothing
//! isomorphic was observed for 6 minutes; a single event leaves the cache 6 minutes after its eventTime, so that a
//! repetition after that is a new Event again.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use std::collections::HashMap;
use std::time::Duration;

/// Upstream's `finishTime`: a series with no observation for this long ends; a single event is forgotten.
pub const FINISH_TIME: Duration = Duration::from_secs(6 * 60);
/// Upstream's `refreshTime`: the heartbeat of running series (their count and lastObservedTime are written).
pub const REFRESH_TIME: Duration = Duration::from_secs(30 * 60);

/// The fields of an object reference that identify it, as a hashable key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct ReferenceKey {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    field_path: Option<String>,
}

impl From<&ObjectReference> for ReferenceKey {
    fn from(r: &ObjectReference) -> Self {
        ReferenceKey {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            resource_version: r.resource_version.clone(),
            field_path: r.field_path.clone(),
        }
    }
}

/// Upstream's `eventKey`: what makes two events isomorphic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventKey {
    type_: Option<String>,
    action: Option<String>,
    reason: Option<String>,
    reporting_controller: Option<String>,
    reporting_instance: Option<String>,
    regarding: ReferenceKey,
    related: ReferenceKey,
}

impl EventKey {
    pub fn of(e: &Event) -> Self {
        EventKey {
            type_: e.type_.clone(),
            action: e.action.clone(),
            reason: e.reason.clone(),
            reporting_controller: e.reporting_controller.clone(),
            reporting_instance: e.reporting_instance.clone(),
            regarding: e.regarding.as_ref().map(ReferenceKey::from).unwrap_or_default(),
            related: e.related.as_ref().map(ReferenceKey::from).unwrap_or_default(),
        }
    }
}

/// The events recently written, by [`EventKey`].
#[derive(Debug, Default)]
pub struct SeriesCache {
    entries: HashMap<EventKey, Event>,
}

fn older_than(t: &MicroTime, now: Timestamp, age: Duration) -> bool {
    let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
    now.as_millisecond().saturating_sub(t.0.as_millisecond()) > age_ms
}

impl SeriesCache {
    /// A new event observed at `now`: what to write, if anything. An Event without `series` is created; one with
    /// `series` is the cached Event of the series, whose `series` is patched.
    pub fn observe(&mut self, event: Event, now: Timestamp) -> Option<Event> {
        let key = EventKey::of(&event);
        match self.entries.get_mut(&key) {
            Some(cached) => match &mut cached.series {
                Some(series) => {
                    series.count = series.count.saturating_add(1);
                    series.last_observed_time = MicroTime(now);
                    None
                }
                None => {
                    cached.series = Some(EventSeries { count: 2, last_observed_time: MicroTime(now) });
                    Some(cached.clone())
                }
            },
            None => {
                self.entries.insert(key, event.clone());
                Some(event)
            }
        }
    }

    /// Every [`FINISH_TIME`]: ended series leave the cache and are returned for their final write; single events
    /// older than the window leave it silently.
    pub fn finish(&mut self, now: Timestamp) -> Vec<Event> {
        let mut last_writes = Vec::new();
        self.entries.retain(|_, e| match &e.series {
            Some(series) if older_than(&series.last_observed_time, now, FINISH_TIME) => {
                last_writes.push(e.clone());
                false
            }
            Some(_) => true,
            None => !e.event_time.as_ref().is_some_and(|t| older_than(t, now, FINISH_TIME)),
        });
        last_writes
    }

    /// Every [`REFRESH_TIME`]: the running series, to be written again (their heartbeat).
    pub fn heartbeat(&self) -> Vec<Event> {
        self.entries.values().filter(|e| e.series.is_some()).cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).expect("time")
    }

    fn event(name: &str, regarding: &str, reason: &str, note: &str, seconds: i64) -> Event {
        Event {
            metadata: ObjectMeta { name: Some(name.into()), namespace: Some("default".into()), ..Default::default() },
            event_time: Some(MicroTime(at(seconds))),
            action: Some("Migrate".into()),
            reason: Some(reason.into()),
            note: Some(note.into()),
            reporting_controller: Some("migration-apiserver".into()),
            reporting_instance: Some("migration-apiserver-host".into()),
            regarding: Some(ObjectReference { name: Some(regarding.into()), ..Default::default() }),
            type_: Some("Warning".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_repetition_becomes_a_series_written_once_then_counted() {
        let mut cache = SeriesCache::default();
        let first = cache.observe(event("m.1", "m", "MigrationRetrying", "503", 0), at(0)).expect("created");
        assert_eq!((first.metadata.name.as_deref(), first.series.as_ref()), (Some("m.1"), None));
        // Same key, another note and name: the cached Event (its name, its first note) becomes a series of 2.
        let patched = cache.observe(event("m.2", "m", "MigrationRetrying", "429", 5), at(5)).expect("patched");
        assert_eq!(patched.metadata.name.as_deref(), Some("m.1"));
        assert_eq!(patched.note.as_deref(), Some("503"));
        assert_eq!(patched.series, Some(EventSeries { count: 2, last_observed_time: MicroTime(at(5)) }));
        // Further repetitions are only counted.
        assert_eq!(cache.observe(event("m.3", "m", "MigrationRetrying", "503", 9), at(9)), None);
        assert_eq!(cache.observe(event("m.4", "m", "MigrationRetrying", "503", 12), at(12)), None);
        let beat = cache.heartbeat();
        assert_eq!(beat.len(), 1);
        assert_eq!(beat[0].series, Some(EventSeries { count: 4, last_observed_time: MicroTime(at(12)) }));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn other_reasons_or_objects_are_not_isomorphic() {
        let mut cache = SeriesCache::default();
        assert!(cache.observe(event("a.1", "a", "MigrationRetrying", "x", 0), at(0)).is_some());
        let other_reason = cache.observe(event("a.2", "a", "MigrationFailed", "x", 1), at(1)).expect("created");
        assert_eq!(other_reason.series, None);
        let other_object = cache.observe(event("b.1", "b", "MigrationRetrying", "x", 1), at(1)).expect("created");
        assert_eq!(other_object.series, None);
        let mut normal = event("a.3", "a", "MigrationRetrying", "x", 2);
        normal.type_ = Some("Normal".into());
        assert_eq!(cache.observe(normal, at(2)).expect("created").series, None, "another type");
        let mut elsewhere = event("a.4", "a", "MigrationRetrying", "x", 2);
        elsewhere.reporting_instance = Some("migration-apiserver-other".into());
        assert_eq!(cache.observe(elsewhere, at(2)).expect("created").series, None, "another instance");
        assert_eq!(cache.len(), 5);
        assert!(cache.heartbeat().is_empty());
    }

    #[test]
    fn series_end_after_six_quiet_minutes_with_a_final_write() {
        let mut cache = SeriesCache::default();
        cache.observe(event("m.1", "m", "MigrationRetrying", "503", 0), at(0));
        cache.observe(event("m.2", "m", "MigrationRetrying", "503", 10), at(10));
        cache.observe(event("m.3", "m", "MigrationRetrying", "503", 20), at(20));
        // Within the window: kept, nothing written.
        assert!(cache.finish(at(20 + 360)).is_empty());
        assert_eq!(cache.len(), 1);
        let last = cache.finish(at(20 + 361));
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].series, Some(EventSeries { count: 3, last_observed_time: MicroTime(at(20)) }));
        assert!(cache.is_empty());
        // After the series ended, the same event starts afresh as a new Event.
        let again = cache.observe(event("m.9", "m", "MigrationRetrying", "503", 400), at(400)).expect("created");
        assert_eq!((again.metadata.name.as_deref(), again.series), (Some("m.9"), None));
    }

    #[test]
    fn single_events_leave_the_window_silently() {
        let mut cache = SeriesCache::default();
        cache.observe(event("m.1", "m", "MigrationStarted", "go", 0), at(0));
        assert!(cache.finish(at(360)).is_empty());
        assert_eq!(cache.len(), 1, "still inside the window");
        assert!(cache.finish(at(361)).is_empty(), "a single event has nothing left to write");
        assert!(cache.is_empty());
        let fresh = cache.observe(event("m.2", "m", "MigrationStarted", "go", 362), at(362)).expect("created");
        assert_eq!(fresh.series, None);
    }
}
