//! Topology translation shared by the plugins (csi-translation-lib's `in_tree_volume.go`): zone/region keys in a PV's
//! node affinity and labels (GA `topology.kubernetes.io/*` and beta `failure-domain.beta.kubernetes.io/*`), multi-zone
//! label values joined with `__`, and the allowed topologies of a StorageClass.

use super::{Result, TranslationError};
use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, TopologySelectorLabelRequirement,
    TopologySelectorTerm, VolumeNodeAffinity,
};
use std::collections::BTreeSet;

pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
pub const LABEL_FAILURE_DOMAIN_BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
pub const LABEL_FAILURE_DOMAIN_BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
/// Separates the zones of a multi-zone (regional) volume in a zone label value.
pub const LABEL_MULTI_ZONE_DELIMITER: &str = "__";

/// Derives a region from the zones of one node selector term (per cloud's zone naming).
pub type RegionParser = fn(&[String]) -> Result<String>;

fn terms(pv: &PersistentVolume) -> &[NodeSelectorTerm] {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or(&[])
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    pv.spec.as_mut()?.node_affinity.as_mut()?.required.as_mut().map(|r| &mut r.node_selector_terms)
}

fn requirement(key: &str, values: Vec<String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement { key: key.to_string(), operator: "In".to_string(), values: Some(values) }
}

/// Renames `old_key` to `new_key` in every node selector term. Values of an existing `new_key` expression are not
/// merged with the renamed one (as upstream).
pub fn replace_topology(pv: &mut PersistentVolume, old_key: &str, new_key: &str) {
    for term in terms_mut(pv).into_iter().flatten() {
        for r in term.match_expressions.iter_mut().flatten() {
            if r.key == old_key {
                r.key = new_key.to_string();
            }
        }
    }
}

/// Every value of `key` in the node affinity, unique and sorted (the terms' zones collapse into one ORed list).
pub fn topology_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let mut values = BTreeSet::new();
    for term in terms(pv) {
        for r in term.match_expressions.iter().flatten().filter(|r| r.key == key) {
            values.extend(r.values.iter().flatten().cloned());
        }
    }
    values.into_iter().collect()
}

/// Appends `key In zones` (trimmed, non-empty, unique, sorted) to every term, creating the node affinity if needed.
pub fn add_topology(pv: &mut PersistentVolume, key: &str, zones: &[String]) -> Result<()> {
    let zones: BTreeSet<String> = zones.iter().map(|z| z.trim().to_string()).filter(|z| !z.is_empty()).collect();
    if zones.is_empty() {
        return Err(TranslationError::new("there are no valid zones to add to pv"));
    }
    let spec = pv.spec.get_or_insert_with(Default::default);
    let affinity = spec.node_affinity.get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    let zones: Vec<String> = zones.into_iter().collect();
    for term in &mut required.node_selector_terms {
        term.match_expressions.get_or_insert_with(Vec::new).push(requirement(key, zones.clone()));
    }
    Ok(())
}

/// Whether any term of the node affinity has an expression on `key`.
pub fn topology_key_exists(key: &str, affinity: Option<&VolumeNodeAffinity>) -> bool {
    affinity.and_then(|a| a.required.as_ref()).is_some_and(|r| {
        r.node_selector_terms.iter().any(|t| t.match_expressions.iter().flatten().any(|e| e.key == key))
    })
}

/// The zone and region labels a PV uses: GA or beta, from its node affinity first, then its labels; GA when
/// neither says.
pub fn topology_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
    let labels = pv.metadata.labels.as_ref();
    let has_label = |k: &str| labels.is_some_and(|l| l.contains_key(k));
    if topology_key_exists(LABEL_TOPOLOGY_ZONE, affinity) {
        (LABEL_TOPOLOGY_ZONE, LABEL_TOPOLOGY_REGION)
    } else if topology_key_exists(LABEL_FAILURE_DOMAIN_BETA_ZONE, affinity) {
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_FAILURE_DOMAIN_BETA_REGION)
    } else if has_label(LABEL_TOPOLOGY_ZONE) {
        (LABEL_TOPOLOGY_ZONE, LABEL_TOPOLOGY_REGION)
    } else if has_label(LABEL_FAILURE_DOMAIN_BETA_ZONE) {
        (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_FAILURE_DOMAIN_BETA_REGION)
    } else {
        (LABEL_TOPOLOGY_ZONE, LABEL_TOPOLOGY_REGION)
    }
}

fn label<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a String> {
    pv.metadata.labels.as_ref().and_then(|l| l.get(key))
}

/// Sets a label unless the PV already has it.
fn label_if_absent(pv: &mut PersistentVolume, key: &str, value: String) {
    pv.metadata.labels.get_or_insert_with(Default::default).entry(key.to_string()).or_insert(value);
}

/// In-tree -> CSI: the zone key of the node affinity becomes `csi_key`; without zone affinity, the zone label (split
/// on `__`) becomes one. A beta region key in the affinity becomes the GA one, so that nodes with only GA labels
/// still match.
pub fn translate_topology_from_in_tree_to_csi(pv: &mut PersistentVolume, csi_key: &str) {
    let (zone_label, region_label) = topology_labels(pv);
    if !topology_values(pv, zone_label).is_empty() {
        replace_topology(pv, zone_label, csi_key);
    } else if let Some(value) = label(pv, zone_label).cloned() {
        let zones: Vec<String> = value.split(LABEL_MULTI_ZONE_DELIMITER).map(str::to_string).collect();
        // Upstream ignores a label without a usable zone.
        let _ = add_topology(pv, csi_key, &zones);
    }
    if region_label == LABEL_FAILURE_DOMAIN_BETA_REGION && !topology_values(pv, region_label).is_empty() {
        replace_topology(pv, region_label, LABEL_TOPOLOGY_REGION);
    }
}

/// CSI -> in-tree, for rollback: `csi_key` becomes the Kubernetes zone key; with a region parser, each term without
/// a region gets one derived from its zones; zone (and a single region) labels are added when missing.
pub fn translate_topology_from_csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region_parser: Option<RegionParser>,
) -> Result<()> {
    let (zone_label, _) = topology_labels(pv);
    replace_topology(pv, csi_key, zone_label);
    if let Some(parser) = region_parser {
        region_topology_handler(pv, parser)
            .map_err(|e| TranslationError::new(format!("Failed to handle region topology. error: {e}")))?;
    }
    let zones = topology_values(pv, zone_label);
    if !zones.is_empty() {
        label_if_absent(pv, zone_label, zones.join(LABEL_MULTI_ZONE_DELIMITER));
    }
    Ok(())
}

/// Adds a region expression, derived from the term's zones, to every term that has none; labels the PV with the
/// region when there is exactly one.
pub fn region_topology_handler(pv: &mut PersistentVolume, parser: RegionParser) -> Result<()> {
    if terms(pv).is_empty() {
        return Ok(());
    }
    let (zone_label, region_label) = topology_labels(pv);
    if let Some(terms) = terms_mut(pv) {
        for term in terms.iter_mut() {
            let mut zones = Vec::new();
            let mut has_region = false;
            for r in term.match_expressions.iter().flatten() {
                if r.key == region_label {
                    has_region = true;
                    break;
                } else if r.key == zone_label {
                    zones.extend(r.values.iter().flatten().cloned());
                }
            }
            if has_region {
                continue;
            }
            let region = parser(&zones)?;
            term.match_expressions.get_or_insert_with(Vec::new).push(requirement(region_label, vec![region]));
        }
    }
    let regions = topology_values(pv, region_label);
    if let [region] = regions.as_slice() {
        label_if_absent(pv, region_label, region.clone());
    }
    Ok(())
}

/// The allowed topologies of a StorageClass with the GA and beta zone keys renamed to `key`; other keys pass. A
/// term without expressions comes out without the field (upstream builds each term anew, nil until appended to).
pub fn translate_allowed_topologies(terms: &[TopologySelectorTerm], key: &str) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|term| TopologySelectorTerm {
            match_label_expressions: term.match_label_expressions.as_ref().filter(|e| !e.is_empty()).map(|exprs| {
                exprs
                    .iter()
                    .map(|e| {
                        if e.key == LABEL_FAILURE_DOMAIN_BETA_ZONE || e.key == LABEL_TOPOLOGY_ZONE {
                            TopologySelectorLabelRequirement { key: key.to_string(), values: e.values.clone() }
                        } else {
                            e.clone()
                        }
                    })
                    .collect()
            }),
        })
        .collect()
}

/// One allowed-topology term: `key` in `values`.
pub fn topology_selectors(key: &str, values: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement { key: key.to_string(), values }]),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeSpec;

    fn pv(labels: &[(&str, &str)], exprs: Vec<Vec<NodeSelectorRequirement>>) -> PersistentVolume {
        let mut pv = PersistentVolume::default();
        if !labels.is_empty() {
            pv.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        }
        let mut spec = PersistentVolumeSpec::default();
        if !exprs.is_empty() {
            spec.node_affinity = Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: exprs
                        .into_iter()
                        .map(|e| NodeSelectorTerm { match_expressions: Some(e), match_fields: None })
                        .collect(),
                }),
            });
        }
        pv.spec = Some(spec);
        pv
    }

    fn req(key: &str, values: &[&str]) -> NodeSelectorRequirement {
        requirement(key, values.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn labels_prefer_affinity_then_labels_then_ga() {
        let p = pv(&[(LABEL_TOPOLOGY_ZONE, "a")], vec![vec![req(LABEL_FAILURE_DOMAIN_BETA_ZONE, &["b"])]]);
        assert_eq!(topology_labels(&p).0, LABEL_FAILURE_DOMAIN_BETA_ZONE);
        let p = pv(&[(LABEL_FAILURE_DOMAIN_BETA_ZONE, "a")], vec![]);
        assert_eq!(topology_labels(&p), (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_FAILURE_DOMAIN_BETA_REGION));
        assert_eq!(topology_labels(&pv(&[], vec![])), (LABEL_TOPOLOGY_ZONE, LABEL_TOPOLOGY_REGION));
    }

    #[test]
    fn multi_zone_label_becomes_one_sorted_expression() {
        let mut p = pv(&[(LABEL_TOPOLOGY_ZONE, "z2__z1__ ")], vec![]);
        translate_topology_from_in_tree_to_csi(&mut p, "csi/zone");
        assert_eq!(terms(&p)[0].match_expressions.as_ref().unwrap(), &vec![req("csi/zone", &["z1", "z2"])]);
    }

    #[test]
    fn beta_region_is_renamed_to_ga() {
        let mut p = pv(
            &[],
            vec![vec![req(LABEL_FAILURE_DOMAIN_BETA_ZONE, &["a"]), req(LABEL_FAILURE_DOMAIN_BETA_REGION, &["r"])]],
        );
        translate_topology_from_in_tree_to_csi(&mut p, "csi/zone");
        assert_eq!(
            terms(&p)[0].match_expressions.as_ref().unwrap(),
            &vec![req("csi/zone", &["a"]), req(LABEL_TOPOLOGY_REGION, &["r"])]
        );
    }

    #[test]
    fn region_parser_errors_are_wrapped() {
        let mut p = pv(&[], vec![vec![req("csi/zone", &["a"])]]);
        let e =
            translate_topology_from_csi_to_in_tree(&mut p, "csi/zone", Some(|_| Err(TranslationError::new("nope"))))
                .unwrap_err()
                .to_string();
        assert_eq!(e, "Failed to handle region topology. error: nope");
    }
}
