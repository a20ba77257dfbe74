//! The CSI migration feature gates, set like Kubernetes components set theirs:
//! `--feature-gates=CSIMigrationGCE=true,CSIMigrationAWS=true`. `CSIMigration` is the umbrella gate (on by
//! default); a plugin is migrated when it and the plugin's own gate are on. The per-plugin gates are off by default:
//! migration is opted into plugin by plugin, as the migration design introduced it.

use super::{plugin_by_in_tree_name, plugins};
use std::collections::BTreeMap;
use std::str::FromStr;

/// The umbrella gate.
pub const CSI_MIGRATION: &str = "CSIMigration";

/// Every gate with its default.
pub fn known_gates() -> Vec<(&'static str, bool)> {
    let mut gates = vec![(CSI_MIGRATION, true)];
    gates.extend(plugins().iter().map(|p| (p.feature_gate(), false)));
    gates.sort();
    gates
}

fn known_name(name: &str) -> Option<&'static str> {
    known_gates().into_iter().map(|(n, _)| n).find(|n| *n == name)
}

/// A `--feature-gates` value that does not parse, in component-base's words.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("malformed pair, expect string=bool")]
    MalformedPair,
    /// `value` quoted as Go's strconv.ParseBool quotes it.
    #[error("invalid value of {key}={value}, err: strconv.ParseBool: parsing {}: invalid syntax", super::go::quote(.value))]
    InvalidValue { key: String, value: String },
    #[error("unrecognized feature gate: {key} (known gates: {known})")]
    Unrecognized { key: String, known: String },
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// One `--feature-gates` value: `key=bool` pairs separated by commas, every key a known gate.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateSettings(pub Vec<(&'static str, bool)>);

impl FromStr for GateSettings {
    type Err = GateError;
    fn from_str(value: &str) -> Result<Self, GateError> {
        let mut out = Vec::new();
        for pair in value.split(',').filter(|s| !s.is_empty()) {
            let Some((k, v)) = pair.split_once('=') else {
                return Err(GateError::MalformedPair);
            };
            let (k, v) = (k.trim(), v.trim());
            let b =
                parse_bool(v).ok_or_else(|| GateError::InvalidValue { key: k.to_string(), value: v.to_string() })?;
            let Some(name) = known_name(k) else {
                let known: Vec<&str> = known_gates().into_iter().map(|(n, _)| n).collect();
                return Err(GateError::Unrecognized { key: k.to_string(), known: known.join(", ") });
            };
            out.push((name, b));
        }
        Ok(GateSettings(out))
    }
}

/// The state of every gate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates { enabled: known_gates().into_iter().collect() }
    }
}

impl FromStr for FeatureGates {
    type Err = GateError;
    fn from_str(value: &str) -> Result<Self, GateError> {
        Ok(FeatureGates::from_settings(&[value.parse()?]))
    }
}

impl FeatureGates {
    /// The defaults overridden by the settings, later ones winning (repeated flags merge).
    pub fn from_settings(settings: &[GateSettings]) -> Self {
        let mut gates = FeatureGates::default();
        for (name, value) in settings.iter().flat_map(|s| s.0.iter()) {
            gates.enabled.insert(name, *value);
        }
        gates
    }

    pub fn enabled(&self, gate: &str) -> bool {
        self.enabled.get(gate).copied().unwrap_or(false)
    }

    /// Whether the in-tree plugin `name` (`kubernetes.io/...`) is migrated to its CSI driver.
    pub fn is_migration_enabled_for_plugin(&self, name: &str) -> bool {
        plugin_by_in_tree_name(name).is_some_and(|p| self.enabled(CSI_MIGRATION) && self.enabled(p.feature_gate()))
    }

    /// The migrated in-tree plugins, sorted (what a CSINode's `storage.alpha.kubernetes.io/migrated-plugins`
    /// annotation lists, comma-joined).
    pub fn migrated_plugins(&self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = plugins()
            .iter()
            .map(|p| p.in_tree_plugin_name())
            .filter(|n| self.is_migration_enabled_for_plugin(n))
            .collect();
        out.sort();
        out
    }

    /// `Gate=bool` for every gate, as the server logs them at start.
    pub fn describe(&self) -> String {
        self.enabled.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_like_kubernetes() {
        let g: FeatureGates = "CSIMigrationGCE=true, CSIMigrationAWS = 1".parse().unwrap();
        assert!(g.is_migration_enabled_for_plugin("kubernetes.io/gce-pd"));
        assert!(g.is_migration_enabled_for_plugin("kubernetes.io/aws-ebs"));
        assert!(!g.is_migration_enabled_for_plugin("kubernetes.io/cinder"));
        assert!(!g.is_migration_enabled_for_plugin("kubernetes.io/nfs"));
        assert_eq!(g.migrated_plugins(), ["kubernetes.io/aws-ebs", "kubernetes.io/gce-pd"]);
        let off: FeatureGates = "CSIMigrationGCE=true,CSIMigration=false".parse().unwrap();
        assert!(off.migrated_plugins().is_empty());
        assert!("Foo=true"
            .parse::<FeatureGates>()
            .unwrap_err()
            .to_string()
            .starts_with("unrecognized feature gate: Foo"));
        assert_eq!(
            "CSIMigrationGCE".parse::<FeatureGates>().unwrap_err().to_string(),
            "malformed pair, expect string=bool"
        );
        assert_eq!(
            "CSIMigrationGCE=yes".parse::<FeatureGates>().unwrap_err().to_string(),
            r#"invalid value of CSIMigrationGCE=yes, err: strconv.ParseBool: parsing "yes": invalid syntax"#
        );
        let merged = FeatureGates::from_settings(&[
            "CSIMigrationGCE=true".parse().unwrap(),
            "CSIMigrationGCE=false,CSIMigrationPortworx=true".parse().unwrap(),
        ]);
        assert_eq!(merged.migrated_plugins(), ["kubernetes.io/portworx-volume"]);
        assert_eq!(FeatureGates::default().migrated_plugins(), Vec::<&str>::new());
    }
}
