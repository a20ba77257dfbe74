//! Upstream: kubernetes/csi-translation-lib `plugins/in_tree_volume_test.go` at
//! 83cf1e337910ea773d78dcb905d57e8305b3f65d (file last changed in ab8bd6e, kubernetes/kubernetes
//! 5b284a50b78cb7d68b12825f5c0cfa29503c1577).
//!
//! Upstream calls the shared topology helpers with a key and a region parser of its choosing; here each runs inside
//! the translation that calls it with that key and parser:
//! - TestTranslateTopologyFromCSIToInTree: a GCE PD CSI PV back in-tree (GCE key, GCE region parser); the cases
//!   with the Cinder key or no parser: a Cinder CSI PV (Cinder passes no parser). "regionParser is missing" is
//!   upstream's GCE key without a parser, which no plugin does: it runs on the Cinder key.
//! - TestTranslateTopologyFromInTreeToCSI: a GCE PD PV to CSI.
//! - TestTranslateAllowedTopologies: the allowed topologies of a GCE PD StorageClass.
//! - TestAddTopology: a PV whose zone label holds the zones (joined by `__`) translated to CSI, without node
//!   affinity, so the zones are added. It is a Cinder PV: a GCE PD PV would first make a regional handle of them,
//!   which fails on the whitespace zones. A failure to add (no valid zone) is ignored by the translation: no
//!   affinity.
//! - TestReplaceTopology: a Cinder CSI PV back in-tree (its key becomes the zone key; nothing else is added to the
//!   terms, as replaceTopology alone does).

use super::*;
use serde_json::{json, Value};

const GCE_KEY: &str = "topology.gke.io/zone";
const CINDER_KEY: &str = "topology.cinder.csi.openstack.org/zone";

fn gce_csi() -> Value {
    json!({"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/z/disks/d"})
}

fn cinder_csi() -> Value {
    json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "vol"})
}

/// A PV named as upstream's (`gcepd` in `myns`), with labels and terms when given, and `source`.
fn topology_pv(name: &str, labels: Value, terms: Option<Vec<Vec<Value>>>, source: Value) -> Value {
    let mut meta = json!({"name": name, "namespace": "myns"});
    if !labels.is_null() {
        meta["labels"] = labels;
    }
    let mut spec = source;
    if let Some(terms) = terms {
        spec["nodeAffinity"] = affinity(terms);
    }
    pv(meta, spec)
}

fn terms_and_labels(terms: Vec<Vec<Value>>, labels: Value) -> Expect {
    parts(vec![
        ("/spec/nodeAffinity/required/nodeSelectorTerms", affinity(terms)["required"]["nodeSelectorTerms"].clone()),
        ("/metadata/labels", labels),
    ])
}

fn to_in_tree(name: &str, csi: Value, labels: Value, terms: Vec<Vec<Value>>, expect: Expect) -> Case {
    let input = topology_pv("gcepd", labels, Some(terms), json!({"csi": csi}));
    case(format!("TestTranslateTopologyFromCSIToInTree/{name}"), Input::PvToInTree(input), expect)
}

fn allowed(name: &str, topologies: Value, want: Value) -> Case {
    let input = Input::StorageClass(sc("kubernetes.io/gce-pd", Value::Null, topologies));
    case(format!("TestTranslateAllowedTopologies/{name}"), input, parts(vec![("/allowedTopologies", want)]))
}

fn add_topology(name: &str, zone_label: &str, want: Value) -> Case {
    let input = pv(json!({"labels": {GA_ZONE: zone_label}}), json!({"cinder": {"volumeID": "vol"}}));
    case(format!("TestAddTopology/{name}"), Input::PvToCsi(input), parts(vec![("/spec/nodeAffinity", want)]))
}

fn replace(name: &str, terms: Vec<Vec<Value>>, want: Vec<Vec<Value>>) -> Case {
    let input = pv(json!({}), json!({"csi": cinder_csi(), "nodeAffinity": affinity(terms)}));
    case(
        format!("TestReplaceTopology/{name}"),
        Input::PvToInTree(input),
        parts(vec![("/spec/nodeAffinity", affinity(want))]),
    )
}

pub fn cases() -> Vec<Case> {
    let useast1a_ga = labels(&[(GA_ZONE, "us-east1-a"), (GA_REGION, "us-east1")]);
    let uswest2b_beta = labels(&[(BETA_ZONE, "us-west2-b"), (BETA_REGION, "us-west2")]);
    let existing = labels(&[(GA_ZONE, "existingZone"), (GA_REGION, "existingRegion")]);
    let ga_zone_first = vec![vec![req(GA_ZONE, &["us-east1-a"]), req(GA_REGION, &["us-east1"])]];
    let ga_region_first = vec![vec![req(GA_REGION, &["us-east1"]), req(GA_ZONE, &["us-east1-a"])]];
    let beta_zone_first = vec![vec![req(BETA_ZONE, &["us-west2-b"]), req(BETA_REGION, &["us-west2"])]];
    let beta_region_first = vec![vec![req(BETA_REGION, &["us-west2"]), req(BETA_ZONE, &["us-west2-b"])]];
    let gce = |zone: &str| req(GCE_KEY, &[zone]);
    let to_csi_terms = |name: &str, labels: Value, terms: Vec<Vec<Value>>, want: Vec<Vec<Value>>| {
        let input = topology_pv("gcepd", labels, Some(terms), json!({"gcePersistentDisk": {"pdName": "pd"}}));
        let expect = parts(vec![(
            "/spec/nodeAffinity/required/nodeSelectorTerms",
            affinity(want)["required"]["nodeSelectorTerms"].clone(),
        )]);
        case(format!("TestTranslateTopologyFromInTreeToCSI/{name}"), Input::PvToCsi(input), expect)
    };
    let sorted = json!(["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]);
    vec![
        to_in_tree(
            "Remove CSI Topology Key and do not change existing GA Kubernetes topology",
            gce_csi(),
            useast1a_ga.clone(),
            vec![vec![req(GA_REGION, &["us-east1"]), gce("us-east1-a")]],
            terms_and_labels(ga_region_first, useast1a_ga.clone()),
        ),
        to_in_tree(
            "Remove CSI Topology Key and do not change existing Beta Kubernetes topology",
            gce_csi(),
            uswest2b_beta.clone(),
            vec![vec![req(BETA_REGION, &["us-west2"]), gce("us-west2-b")]],
            terms_and_labels(beta_region_first, uswest2b_beta.clone()),
        ),
        to_in_tree(
            "Remove CSI Topology Key and add Kubernetes topology from NodeAffinity, ignore labels",
            gce_csi(),
            existing.clone(),
            vec![vec![gce("us-east1-a")]],
            terms_and_labels(ga_zone_first.clone(), existing.clone()),
        ),
        to_in_tree(
            "No CSI topology label exists and no change to the NodeAffinity",
            gce_csi(),
            existing.clone(),
            vec![],
            terms_and_labels(vec![], existing),
        ),
        to_in_tree(
            "Generate GA labels and kubernetes topology only from CSI topology",
            gce_csi(),
            Value::Null,
            vec![vec![gce("us-east1-a")]],
            terms_and_labels(ga_zone_first.clone(), useast1a_ga.clone()),
        ),
        to_in_tree(
            "Generate Beta labels and kubernetes topology from Beta NodeAffinity",
            gce_csi(),
            Value::Null,
            vec![vec![req(BETA_ZONE, &["us-west2-b"])]],
            terms_and_labels(beta_zone_first.clone(), uswest2b_beta),
        ),
        to_in_tree(
            "regionParser is missing and only zone labels get generated",
            cinder_csi(),
            Value::Null,
            vec![vec![req(CINDER_KEY, &["us-east1-a"])]],
            terms_and_labels(vec![vec![req(GA_ZONE, &["us-east1-a"])]], labels(&[(GA_ZONE, "us-east1-a")])),
        ),
        to_in_tree(
            "Replace multi-term CSI Topology Key and add Region Kubernetes topology for both",
            gce_csi(),
            Value::Null,
            vec![vec![gce("us-east1-a")], vec![gce("us-east1-c")]],
            terms_and_labels(
                vec![
                    vec![req(GA_ZONE, &["us-east1-a"]), req(GA_REGION, &["us-east1"])],
                    vec![req(GA_ZONE, &["us-east1-c"]), req(GA_REGION, &["us-east1"])],
                ],
                labels(&[(GA_ZONE, "us-east1-a__us-east1-c"), (GA_REGION, "us-east1")]),
            ),
        ),
        to_in_tree(
            "cinder translation",
            cinder_csi(),
            Value::Null,
            vec![vec![req(CINDER_KEY, &["nova"])]],
            terms_and_labels(vec![vec![req(GA_ZONE, &["nova"])]], labels(&[(GA_ZONE, "nova")])),
        ),
        to_csi_terms(
            "Replace GA Kubernetes Zone Topology to GCE CSI Topology",
            useast1a_ga.clone(),
            ga_zone_first,
            vec![vec![gce("us-east1-a"), req(GA_REGION, &["us-east1"])]],
        ),
        to_csi_terms(
            "Replace Beta Kubernetes Topology to GCE CSI Topology and upgrade region label",
            useast1a_ga,
            beta_zone_first,
            vec![vec![gce("us-west2-b"), req(GA_REGION, &["us-west2"])]],
        ),
        allowed("no translation", selectors(GCE_KEY, &["foo", "bar"]), selectors(GCE_KEY, &["foo", "bar"])),
        allowed("translate", selectors(BETA_ZONE, &["foo", "bar"]), selectors(GCE_KEY, &["foo", "bar"])),
        allowed(
            "combo",
            json!([{"matchLabelExpressions": [{"key": BETA_ZONE, "values": ["foo", "bar"]},
                {"key": GCE_KEY, "values": ["boo", "baz"]}]}]),
            json!([{"matchLabelExpressions": [{"key": GCE_KEY, "values": ["foo", "bar"]},
                {"key": GCE_KEY, "values": ["boo", "baz"]}]}]),
        ),
        allowed("some other key", selectors("test", &["foo", "bar"]), selectors("test", &["foo", "bar"])),
        add_topology("empty zones", "", Value::Null),
        add_topology("only whitespace-named zones", " __\n__\t__  ", Value::Null),
        add_topology(
            "including whitespace-named zones",
            " __us-central1-a",
            affinity(vec![vec![req(CINDER_KEY, &["us-central1-a"])]]),
        ),
        add_topology(
            "unsorted zones",
            "us-central1-f__us-central1-a__us-central1-c__us-central1-b",
            json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": CINDER_KEY, "operator": "In", "values": sorted}]}]}}),
        ),
        replace(
            "Replace single csi topology from PV",
            vec![vec![req(CINDER_KEY, &["us-east1-a"])]],
            vec![vec![req(GA_ZONE, &["us-east1-a"])]],
        ),
        replace(
            "Not found the topology key so do nothing",
            vec![vec![req(GA_ZONE, &["us-east1-a"])]],
            vec![vec![req(GA_ZONE, &["us-east1-a"])]],
        ),
        replace(
            "Replace the topology key from multiple terms",
            vec![vec![req(CINDER_KEY, &["us-east1-a"])], vec![req(CINDER_KEY, &["us-east1-c"])]],
            vec![vec![req(GA_ZONE, &["us-east1-a"])], vec![req(GA_ZONE, &["us-east1-c"])]],
        ),
        replace(
            "Replace the topology key from single term and not combine topology key",
            vec![vec![req(CINDER_KEY, &["us-east1-a"]), req(GA_ZONE, &["us-east1-c"])]],
            vec![vec![req(GA_ZONE, &["us-east1-a"]), req(GA_ZONE, &["us-east1-c"])]],
        ),
    ]
}
