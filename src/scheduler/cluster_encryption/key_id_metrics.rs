//! The key_id each kube-apiserver's KMS v2 plugins reported last, from its `/metrics`.
//!
//! kube-apiserver sets `apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds{provider_name,
//! key_id_hash,apiserver_id_hash}` to the current time on every Status reply with a valid key_id (k8s.io/apiserver
//! pkg/storage/value/encrypt/envelope/metrics). A series is only deleted when its label set is evicted from a cache
//! of 100 entries, so the series of older key_ids stay exported next to the current one: per (apiserver, provider)
//! the series with the newest value is the key_id its plugin reports now, whatever else is still listed.

use super::prometheus_text::samples;
use std::collections::BTreeMap;

/// The gauge kube-apiserver sets on every valid Status reply of a KMS v2 plugin.
pub const KEY_ID_STATUS: &str = "apiserver_envelope_encryption_key_id_hash_status_last_timestamp_seconds";

/// apiserver_id_hash -> provider_name -> the key_id_hash of the newest series, from a Prometheus text exposition.
/// Two series of one (apiserver, provider) with the same newest value and different key_ids say nothing certain:
/// that provider is left out for that apiserver (reported as not reporting; a later scrape decides).
pub fn parse_status_key_ids(text: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    // (apiserver, provider) -> (newest value, its key_id_hash, or None when tied with another key_id).
    let mut newest: BTreeMap<(String, String), (f64, Option<String>)> = BTreeMap::new();
    for (mut labels, value) in samples(text, KEY_ID_STATUS) {
        let (Some(id), Some(provider), Some(key_id)) =
            (labels.remove("apiserver_id_hash"), labels.remove("provider_name"), labels.remove("key_id_hash"))
        else {
            continue;
        };
        // An empty key_id_hash is what upstream's getHash gives for an empty input, which Status validation refuses.
        if !value.is_finite() || key_id.is_empty() {
            continue;
        }
        match newest.get_mut(&(id.clone(), provider.clone())) {
            Some((at, current)) if value > *at => (*at, *current) = (value, Some(key_id)),
            Some((at, current)) if value == *at && current.as_deref() != Some(key_id.as_str()) => *current = None,
            Some(_) => {}
            None => {
                newest.insert((id, provider), (value, Some(key_id)));
            }
        }
    }
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for ((id, provider), (_, key_id)) in newest {
        if let Some(key_id) = key_id {
            out.entry(id).or_default().insert(provider, key_id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b";
    const K2: &str = "sha256:d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35";

    fn line(id: &str, provider: &str, key_id: &str, value: &str) -> String {
        format!("{KEY_ID_STATUS}{{apiserver_id_hash=\"{id}\",key_id_hash=\"{key_id}\",provider_name=\"{provider}\"}} {value}\n")
    }

    fn one(id: &str, provider: &str, key_id: &str) -> BTreeMap<String, BTreeMap<String, String>> {
        BTreeMap::from([(id.to_string(), BTreeMap::from([(provider.to_string(), key_id.to_string())]))])
    }

    #[test]
    fn the_newest_series_wins_whatever_its_place() {
        // The old key_id's series persists, listed after the new one (the exposition sorts by labels, not time).
        let text = format!(
            "# HELP {KEY_ID_STATUS} [ALPHA] The last time in seconds when a keyID was returned by the Status RPC call.\n\
             # TYPE {KEY_ID_STATUS} gauge\n{}{}",
            line("sha256:a", "vault", K2, "1.7327e+09"),
            line("sha256:a", "vault", K1, "1.7326e+09"),
        );
        assert_eq!(parse_status_key_ids(&text), one("sha256:a", "vault", K2));
        let back =
            format!("{}{}", line("sha256:a", "vault", K2, "1732600000"), line("sha256:a", "vault", K1, "1732700000"));
        assert_eq!(parse_status_key_ids(&back), one("sha256:a", "vault", K1), "presence says nothing, time does");
    }

    #[test]
    fn providers_and_apiservers_are_apart() {
        let text = [
            line("sha256:a", "vault", K1, "100"),
            line("sha256:a", "hsm", K2, "50"),
            line("sha256:b", "vault", K2, "10"),
            // Other metrics of the same family, and the to_storage gauge, are not the Status one.
            format!("{KEY_ID_STATUS}_other{{apiserver_id_hash=\"sha256:a\",key_id_hash=\"x\",provider_name=\"vault\"}} 999\n"),
            format!("apiserver_envelope_encryption_key_id_hash_last_timestamp_seconds{{apiserver_id_hash=\"sha256:a\",key_id_hash=\"{K2}\",provider_name=\"vault\",transformation_type=\"to_storage\"}} 999\n"),
        ]
        .concat();
        let got = parse_status_key_ids(&text);
        assert_eq!(got["sha256:a"], BTreeMap::from([("vault".into(), K1.into()), ("hsm".into(), K2.into())]));
        assert_eq!(got["sha256:b"], BTreeMap::from([("vault".into(), K2.into())]));
    }

    #[test]
    fn ties_bad_values_and_missing_labels_say_nothing() {
        let tie = format!("{}{}", line("sha256:a", "vault", K1, "100"), line("sha256:a", "vault", K2, "100"));
        assert!(parse_status_key_ids(&tie).is_empty());
        // A tie below the newest value does not matter.
        let text = format!("{tie}{}", line("sha256:a", "vault", K2, "101"));
        assert_eq!(parse_status_key_ids(&text), one("sha256:a", "vault", K2));
        let bad = [
            line("sha256:a", "vault", K1, "NaN"),
            line("sha256:a", "vault", "", "100"),
            line("sha256:a", "vault", K1, "soon"),
            format!("{KEY_ID_STATUS}{{apiserver_id_hash=\"sha256:a\",provider_name=\"vault\"}} 100\n"),
            format!("{KEY_ID_STATUS}{{apiserver_id_hash=\"sha256:a\",key_id_hash=\"{K1}\",provider_name=\"vault\"\n"),
        ]
        .concat();
        assert!(parse_status_key_ids(&bad).is_empty());
    }
}
