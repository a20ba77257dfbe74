//! Cell rendering shared by printer columns (kubectl shows these strings as they are).

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Go's `duration.HumanDuration`, as kube-apiserver renders AGE and other date columns.
pub fn human_duration(d: chrono::Duration) -> String {
    let seconds = d.num_seconds();
    if seconds < -1 {
        return "<invalid>".into();
    } else if seconds < 0 {
        return "0s".into();
    } else if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    } else if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    } else if hours < 48 {
        return format!("{hours}h");
    } else if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{}h", hours / 24, h) };
    } else if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    } else if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{}d", hours / 24 / 365, dy) };
    }
    format!("{}y", hours / 24 / 365)
}

/// A date cell: the age of `t`, or `<unknown>` when unset (as kubectl prints).
pub fn age_cell(t: Option<&Time>, now: DateTime<Utc>) -> serde_json::Value {
    match t.and_then(|t| DateTime::<Utc>::from_timestamp(t.0.as_second(), 0)) {
        Some(t) => serde_json::Value::String(human_duration(now - t)),
        None => serde_json::Value::String("<unknown>".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    #[test]
    fn durations_match_go() {
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (9 * 3600, "9h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (800 * 86400, "2y70d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (s, want) in cases {
            assert_eq!(human_duration(Duration::seconds(s)), want, "{s}s");
        }
        assert_eq!(human_duration(Duration::seconds(-5)), "<invalid>");
    }
}
