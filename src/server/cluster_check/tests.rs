use super::*;

const GROUP: &str = "storagemigration.k8s.io";

fn ours() -> Backend {
    Backend::service("migration-apiserver", "migration-apiserver")
}

fn info(major: &str, minor: &str, git: &str) -> Info {
    Info { major: major.into(), minor: minor.into(), git_version: git.into(), ..Default::default() }
}

fn apiservice_of(group: &str, version: &str, backend: Backend) -> ExistingApiService {
    ExistingApiService { name: format!("{version}.{group}"), group: group.into(), version: version.into(), backend }
}

fn apiservice(version: &str, backend: Backend) -> ExistingApiService {
    apiservice_of(GROUP, version, backend)
}

fn facts(minor: u32, apiservices: Vec<ExistingApiService>) -> ClusterFacts {
    let git_version = format!("v1.{minor}.0");
    ClusterFacts { version: ClusterVersion { major: 1, minor, git_version }, apiservices, crds: Vec::new() }
}

fn crd(name: &str, ours: bool) -> ExistingCrd {
    let group = name.split_once('.').expect("plural.group").1;
    ExistingCrd { name: name.into(), group: group.into(), ours }
}

#[test]
fn versions_are_read_as_providers_report_them() {
    let v = |i: Info| ClusterVersion::from_info(&i).map(|v| (v.major, v.minor)).ok();
    assert_eq!(v(info("1", "37", "v1.37.0")), Some((1, 37)));
    assert_eq!(v(info("1", "36+", "v1.36.2-gke.100")), Some((1, 36)));
    assert_eq!(v(info("", "", "v1.35.1")), Some((1, 35)));
    assert_eq!(v(info("", "", "unknown")), None);
    let emulating =
        Info { emulation_major: Some("1".into()), emulation_minor: Some("36".into()), ..info("1", "37", "v1.37.0") };
    assert_eq!(v(emulating), Some((1, 36)));
}

#[test]
fn an_older_cluster_without_the_group_gets_ours() {
    assert_eq!(facts(34, vec![]).apiservice_claim(GROUP, &ours()), None);
    let with_ours = facts(36, vec![apiservice("v1", ours()), apiservice("v1beta1", ours())]);
    assert_eq!(with_ours.apiservice_claim(GROUP, &ours()), None);
    assert!(with_ours.hidden_by_ours(&ours()).is_empty());
    // Groups kube-apiserver never serves are ours where nothing else serves them, whatever the release.
    assert_eq!(facts(40, vec![]).apiservice_claim("migration.k8s.io", &ours()), None);
}

#[test]
fn a_cluster_serving_the_group_is_left_alone() {
    let local = facts(37, vec![apiservice("v1", Backend::Local)]);
    assert!(matches!(local.apiservice_claim(GROUP, &ours()), Some(Claimed::LocalApiService { .. })));
    // Enabled with --runtime-config before 1.37: its local APIService.
    let beta = facts(35, vec![apiservice("v1beta1", Backend::Local)]);
    let why = beta.apiservice_claim(GROUP, &ours()).expect("skipped");
    assert_eq!(why.to_string(), "the cluster serves storagemigration.k8s.io itself (APIService v1beta1.storagemigration.k8s.io is local: no spec.service, kube-apiserver's own)");
    // 1.37 with the group turned off (--runtime-config=storagemigration.k8s.io/v1=false): discovery has no
    // APIService of it, so the group is free whatever /version says.
    assert_eq!(facts(37, vec![]).apiservice_claim(GROUP, &ours()), None);
    assert_eq!(facts(37, vec![]).crd_claim(GROUP, &ours()), None);
    // 1.37 under an APIService of ours registered before the upgrade: discovery shows ours, the release tells.
    let under_ours = facts(37, vec![apiservice("v1", ours())]);
    assert!(matches!(under_ours.crd_claim(GROUP, &ours()), Some(Claimed::OursAggregated { .. })));
    assert!(matches!(under_ours.apiservice_claim(GROUP, &ours()), Some(Claimed::Release { .. })));
    let other = facts(34, vec![apiservice("v1", Backend::service("x", "other"))]);
    assert!(matches!(other.apiservice_claim(GROUP, &ours()), Some(Claimed::OtherServer { .. })));
    assert!(other.hidden_by_ours(&ours()).is_empty(), "another server's APIService is not ours to delete");
}

#[test]
fn another_servers_group_is_skipped_whole_in_both_forms() {
    // gardener-apiserver registers v1beta1 only: our v1alpha1 would split the group between two servers.
    let gardener = "core.gardener.cloud";
    let garden = facts(34, vec![apiservice_of(gardener, "v1beta1", Backend::service("garden", "gardener-apiserver"))]);
    let why = garden.apiservice_claim(gardener, &ours()).expect("skipped");
    assert_eq!(
        why.to_string(),
        "APIService v1beta1.core.gardener.cloud registers core.gardener.cloud for another server (Service garden/gardener-apiserver)"
    );
    assert_eq!(why.served_by(), "service/garden/gardener-apiserver");
    assert!(matches!(garden.crd_claim(gardener, &ours()), Some(Claimed::OtherServer { .. })));
    // The other groups stay ours.
    assert_eq!(garden.apiservice_claim("migration.k8s.io", &ours()), None);
    assert_eq!(garden.crd_claim("migration.k8s.io", &ours()), None);
}

#[test]
fn someone_elses_crds_of_the_group_are_neither_hidden_nor_replaced() {
    // kube-storage-version-migrator: its CRDs, and kube-apiserver's automanaged APIService for them.
    let group = "migration.k8s.io";
    let mut ksvm = facts(34, vec![apiservice_of(group, "v1alpha1", Backend::CustomResources)]);
    ksvm.crds =
        vec![crd("storagestates.migration.k8s.io", false), crd("storageversionmigrations.migration.k8s.io", false)];
    let aggregated = ksvm.apiservice_claim(group, &ours()).expect("our APIService would hide their CRDs");
    assert!(matches!(aggregated, Claimed::CustomResources { ours: false, .. }), "{aggregated}");
    assert!(
        aggregated.to_string().contains("storagestates.migration.k8s.io, storageversionmigrations.migration.k8s.io"),
        "{aggregated}"
    );
    let crds = ksvm.crd_claim(group, &ours()).expect("our CRDs would replace theirs");
    assert!(crds.to_string().contains("carry their objects over and delete them first"), "{crds}");
    // The server serving the group sees it routed to those CRDs.
    let elsewhere = ksvm.served_elsewhere(&[group], &ours());
    assert_eq!(elsewhere.len(), 1);
    assert_eq!(elsewhere[0].1.served_by(), "customresourcedefinitions");
}

#[test]
fn our_own_crds_are_updated_by_the_crd_form_and_block_the_aggregated_one() {
    let group = "migration.k8s.io";
    let mut ours_crds = facts(34, vec![apiservice_of(group, "v1alpha1", Backend::CustomResources)]);
    ours_crds.crds = vec![crd("storagestates.migration.k8s.io", true)];
    assert_eq!(ours_crds.crd_claim(group, &ours()), None, "installing our CRDs again updates them");
    let why = ours_crds.apiservice_claim(group, &ours()).expect("switching forms needs our CRDs gone");
    assert!(matches!(why, Claimed::CustomResources { ours: true, .. }), "{why}");
    assert!(ours_crds.served_elsewhere(&[group], &ours()).is_empty(), "the CRD form serves our group");
    // And the other way round: our APIService is in the way of our CRDs.
    let aggregated = facts(34, vec![apiservice_of(group, "v1alpha1", ours())]);
    assert!(matches!(aggregated.crd_claim(group, &ours()), Some(Claimed::OursAggregated { .. })));
}

#[test]
fn crds_of_the_group_are_neither_the_cluster_nor_in_the_way_of_our_crds() {
    let crds = facts(34, vec![apiservice("v1", Backend::CustomResources)]);
    let why = crds.apiservice_claim(GROUP, &ours()).expect("our APIServices would hide the CRDs");
    assert!(matches!(why, Claimed::CustomResources { .. }) && !why.by_the_cluster(), "{why}");
    assert_eq!(crds.crd_claim(GROUP, &ours()), None, "no CRD of another installation: ours, updated");
    // The CRD form still steps aside for the cluster's own API.
    assert!(matches!(
        facts(37, vec![apiservice("v1", Backend::Local)]).crd_claim(GROUP, &ours()),
        Some(Claimed::LocalApiService { .. })
    ));
    let local = facts(35, vec![apiservice("v1beta1", Backend::Local), apiservice("v1", Backend::CustomResources)]);
    assert!(matches!(local.crd_claim(GROUP, &ours()), Some(Claimed::LocalApiService { .. })));
}

#[test]
fn the_crd_label_tells_crd_apiservices_from_built_in_ones() {
    let api = |label: Option<&str>| {
        let labels = label.map(|v| [(AUTOMANAGED_LABEL.to_string(), v.to_string())].into());
        let a = APIService {
            metadata: kube::api::ObjectMeta { name: Some(format!("v1.{GROUP}")), labels, ..Default::default() },
            spec: Some(Default::default()),
            status: None,
        };
        ExistingApiService::from(&a).backend
    };
    assert_eq!(api(Some("true")), Backend::CustomResources);
    assert_eq!(api(Some("onstart")), Backend::Local);
    assert_eq!(api(None), Backend::Local);
}

#[test]
fn an_upgrade_under_ours_names_every_apiservice_to_delete() {
    let upgraded = facts(37, vec![apiservice("v1", ours()), apiservice("v1beta1", ours())]);
    let hidden: Vec<String> = upgraded.hidden_by_ours(&ours()).into_iter().map(|(a, _)| a.name).collect();
    assert_eq!(hidden, ["v1.storagemigration.k8s.io", "v1beta1.storagemigration.k8s.io"]);
    // On 1.36 with v1beta1 enabled while ours serves v1: the local one gives it away.
    let mixed = facts(36, vec![apiservice("v1", ours()), apiservice("v1beta1", Backend::Local)]);
    let hidden: Vec<String> = mixed.hidden_by_ours(&ours()).into_iter().map(|(a, _)| a.name).collect();
    assert_eq!(hidden, ["v1.storagemigration.k8s.io"]);
    // After the hand-over the cluster's local APIService is not "elsewhere": it is where the group belongs.
    let handed_over = facts(37, vec![apiservice("v1", Backend::Local)]);
    assert!(handed_over.served_elsewhere(&[GROUP], &ours()).is_empty());
}
