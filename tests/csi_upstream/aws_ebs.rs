//! Upstream: kubernetes/csi-translation-lib `plugins/aws_ebs_test.go` at 83cf1e337910ea773d78dcb905d57e8305b3f65d
//! (file last changed in 0feceeb, kubernetes/kubernetes 1298c8a5fe6a33726f76516f71e83e52c46eee66).
//!
//! TestKubernetesVolumeIDToEBSVolumeID calls `KubernetesVolumeIDToEBSVolumeID`: here the volume handle of an EBS
//! PV translated to CSI. TestGetAwsRegionFromZones calls `getAwsRegionFromZones`: here the region a CSI PV with
//! those zones in one node selector term gets back in-tree (an error names the PV; "empty zones" is a term whose
//! zone expression has no values).

use super::*;
use serde_json::{json, Value};

const DRIVER: &str = "ebs.csi.aws.com";
const PLUGIN: &str = "kubernetes.io/aws-ebs";
const KEY: &str = "topology.ebs.csi.aws.com/zone";

const NORMAL_VOLUME_ID: &str = "vol-02399794d890f9375";
const AWS_VOLUME_ID: &str = "aws:///vol-02399794d890f9375";
const AWS_ZONE_VOLUME_ID: &str = "aws://us-west-2a/vol-02399794d890f9375";
const INVALID_VOLUME_ID: &str = "aws://us-west-2a/02399794d890f9375";
const INVALID_ID_ERROR: &str = "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume \
                                (aws://us-west-2a/02399794d890f9375)";

fn volume_id(name: &str, id: &str, expect: Expect) -> Case {
    let input = pv(json!({"name": "ebs"}), json!({"awsElasticBlockStore": {"volumeID": id}}));
    case(format!("TestKubernetesVolumeIDToEBSVolumeID/{name}"), Input::PvToCsi(input), expect)
}

fn storage_class(name: &str, params: Value, want: Value) -> Case {
    let input = Input::StorageClass(sc(PLUGIN, params, Value::Null));
    case(
        format!("TestTranslateEBSInTreeStorageClassToCSI/{name}"),
        input,
        Expect::Result(sc(PLUGIN, want, Value::Null)),
    )
}

fn inline(name: &str, source: Value, expect: Expect) -> Case {
    let mut volume = json!({"name": "volume"});
    if !source.is_null() {
        volume["awsElasticBlockStore"] = source;
    }
    case(format!("TestTranslateInTreeInlineVolumeToCSI/{name}"), Input::Inline(volume, ""), expect)
}

fn inline_ok() -> Expect {
    parts(vec![
        ("/metadata/name", json!(format!("ebs.csi.aws.com-{NORMAL_VOLUME_ID}"))),
        ("/spec/csi/volumeHandle", json!(NORMAL_VOLUME_ID)),
    ])
}

fn region(name: &str, zones: &[&str], expect: Expect) -> Case {
    let input = pv(
        json!({"name": "ebs"}),
        json!({"csi": {"driver": DRIVER, "volumeHandle": NORMAL_VOLUME_ID}, "nodeAffinity": affinity(vec![vec![req(KEY, zones)]])}),
    );
    case(format!("TestGetAwsRegionFromZones/{name}"), Input::PvToInTree(input), expect)
}

fn region_is(r: &str) -> Expect {
    parts(vec![(label_pointer(GA_REGION), json!(r))])
}

fn region_error(reason: &str) -> Expect {
    Expect::TopologyError(format!("Failed to handle region topology. error: {reason}"))
}

pub fn cases() -> Vec<Case> {
    let handle = |h: &str| parts(vec![("/spec/csi/volumeHandle", json!(h))]);
    vec![
        volume_id("Normal ID format", NORMAL_VOLUME_ID, handle(NORMAL_VOLUME_ID)),
        volume_id("aws:///{volumeId} format", AWS_VOLUME_ID, handle(NORMAL_VOLUME_ID)),
        volume_id("aws://{zone}/{volumeId} format", AWS_ZONE_VOLUME_ID, handle(NORMAL_VOLUME_ID)),
        volume_id("fails on invalid volume ID", INVALID_VOLUME_ID, error(INVALID_ID_ERROR)),
        storage_class("translate normal", json!({"foo": "bar"}), json!({"foo": "bar"})),
        storage_class("translate empty map", json!({}), Value::Null),
        storage_class("translate with fstype", json!({"fstype": "ext3"}), json!({"csi.storage.k8s.io/fstype": "ext3"})),
        storage_class(
            "translate with iops",
            json!({"iopsPerGB": "100"}),
            json!({"iopsPerGB": "100", "allowautoiopspergbincrease": "true"}),
        ),
        inline("Normal ID format", json!({"volumeID": NORMAL_VOLUME_ID}), inline_ok()),
        inline("aws:///{volumeId} format", json!({"volumeID": AWS_VOLUME_ID}), inline_ok()),
        inline("aws://{zone}/{volumeId} format", json!({"volumeID": AWS_ZONE_VOLUME_ID}), inline_ok()),
        inline("fails on invalid volume ID", json!({"volumeID": INVALID_VOLUME_ID}), error(INVALID_ID_ERROR)),
        inline(
            "fails on empty volume source",
            Value::Null,
            error("could not find in-tree plugin translation logic for \"volume\""),
        ),
        region("Commercial zone", &["us-west-2a", "us-west-2b"], region_is("us-west-2")),
        region("Govcloud zone", &["us-gov-east-1a"], region_is("us-gov-east-1")),
        region("Wavelength zone", &["us-east-1-wl1-bos-wlz-1"], region_is("us-east-1")),
        region("Local zone", &["us-west-2-lax-1a"], region_is("us-west-2")),
        region("Invalid: empty zones", &[], region_error("no zones specified")),
        region(
            "Invalid: multiple regions",
            &["us-west-2a", "us-east-1a"],
            region_error("multiple or no regions gotten from zones, got: map[us-east-1:{} us-west-2:{}]"),
        ),
        region(
            "Invalid: region name only",
            &["us-west-2"],
            region_error("Unexpected zone format: us-west-2 is not a valid AWS zone"),
        ),
        region(
            "Invalid: invalid suffix",
            &["us-west-2ab"],
            region_error("Unexpected zone format: us-west-2ab is not a valid AWS zone"),
        ),
        region(
            "Invalid: not enough fields",
            &["us-west"],
            region_error("Unexpected zone format: us-west is not a valid AWS zone"),
        ),
    ]
}
