//! Discovery and OpenAPI details clients notice: caching headers as kube-openapi serves them (ETag, 304,
//! Last-Modified, gzip, hash URLs immutable for a year), resource lists sorted as k8s.io/apiserver lists them, and
//! ShootState in the `all` category. The kubectl tests show the effect: `kubectl get all` lists ShootStates and a
//! second `kubectl explain` does not download the document again.

mod common;
use common::proxy::Proxy;
use common::requests::*;
use common::*;

use axum::http::Method;
use serde_json::json;
use std::io::Read;

const V2_PROTO: &str = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b).read_to_end(&mut out).expect("gzip");
    out
}

fn http_date(s: &str) -> chrono::DateTime<chrono::FixedOffset> {
    chrono::DateTime::parse_from_rfc2822(&s.replace(" GMT", " +0000").replace(" UTC", " +0000"))
        .unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

fn assert_etag(r: &Resp) -> String {
    let etag = r.header("etag").expect("ETag");
    let hash = etag.strip_prefix('"').and_then(|e| e.strip_suffix('"')).unwrap_or_else(|| panic!("quoted: {etag}"));
    assert_eq!(hash.len(), 128, "SHA-512: {etag}");
    assert!(hash.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()), "upper-case hex: {etag}");
    etag
}

#[tokio::test]
async fn openapi_v2_caching_protobuf_and_gzip() {
    let s = Server::start(&[]);
    let c = s.client().await;

    let json_doc = get_accept(&c, "/openapi/v2", "application/json").await;
    assert_eq!(json_doc.status, 200);
    let etag = assert_etag(&json_doc);
    assert_eq!(json_doc.header("cache-control").as_deref(), Some("no-cache, private"));
    let vary = json_doc.header_all("vary").join(",");
    assert!(vary.contains("Accept") && vary.contains("Accept-Encoding"), "{vary}");
    let modified = http_date(&json_doc.header("last-modified").expect("Last-Modified"));
    assert!(modified <= chrono::Utc::now(), "{modified}");

    // Protobuf: the current media type whichever spelling was asked, the same ETag (Vary tells them apart).
    for asked in [V2_PROTO, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"] {
        let r = get_accept(&c, "/openapi/v2", asked).await;
        assert_eq!(r.status, 200, "{asked}");
        assert_eq!(
            r.header("content-type").as_deref(),
            Some("application/com.github.proto-openapi.spec.v2.v1.0+protobuf")
        );
        assert_eq!(r.header("etag").as_deref(), Some(etag.as_str()));
        assert_ne!(r.body, json_doc.body);
    }
    // Quality decides, then specificity: protobuf at q=1 before JSON at q=0.5; */* alone is JSON.
    let r = get_accept(&c, "/openapi/v2", &format!("application/json;q=0.5, {V2_PROTO}")).await;
    assert!(r.header("content-type").is_some_and(|t| t.contains("protobuf")), "{:?}", r.header("content-type"));
    let r = get_accept(&c, "/openapi/v2", "*/*").await;
    assert_eq!((r.header("content-type").as_deref(), r.body.len()), (Some("application/json"), json_doc.body.len()));

    // Conditional requests: 304 without a body or Content-Type, with the ETag.
    for (name, value) in
        [("if-none-match", etag.clone()), ("if-modified-since", json_doc.header("last-modified").unwrap())]
    {
        let r = call(&c, Method::GET, "/openapi/v2", &[("accept", "application/json"), (name, &value)], vec![]).await;
        assert_eq!(r.status, 304, "{name}: {}", r.text());
        assert!(r.body.is_empty() && r.header("content-type").is_none(), "{name}");
        assert_eq!(r.header("etag").as_deref(), Some(etag.as_str()));
    }
    let r = call(&c, Method::GET, "/openapi/v2", &[("if-none-match", "\"stale\"")], vec![]).await;
    assert_eq!((r.status, r.body.len()), (200, json_doc.body.len()));

    // gzip when asked, the same document inside; not when not asked.
    let r =
        call(&c, Method::GET, "/openapi/v2", &[("accept", "application/json"), ("accept-encoding", "gzip")], vec![])
            .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"));
    assert!(r.body.len() < json_doc.body.len() / 2, "{} of {}", r.body.len(), json_doc.body.len());
    assert_eq!(gunzip(&r.body), json_doc.body);
    let r = call(&c, Method::GET, "/openapi/v2", &[("accept", V2_PROTO), ("accept-encoding", "gzip")], vec![]).await;
    assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"));
    assert_eq!(gunzip(&r.body), get_accept(&c, "/openapi/v2", V2_PROTO).await.body);
    assert!(json_doc.header("content-encoding").is_none());

    let r = get_accept(&c, "/openapi/v2", "text/plain").await;
    assert_eq!((r.status, r.body.len()), (406, 0), "{}", r.text());
}

#[tokio::test]
async fn openapi_v3_hash_urls_are_immutable_for_a_year() {
    let s = Server::start(&[]);
    let c = s.client().await;

    let root = get(&c, "/openapi/v3").await;
    let root_etag = root.header("etag").expect("root ETag");
    assert_eq!(root.header("cache-control").as_deref(), Some("no-cache, private"));
    let r = call(&c, Method::GET, "/openapi/v3", &[("if-none-match", &root_etag)], vec![]).await;
    assert_eq!(r.status, 304);

    let url = root.json()["paths"]["apis/core.gardener.cloud/v1beta1"]["serverRelativeURL"]
        .as_str()
        .expect("serverRelativeURL")
        .to_string();
    let r = get(&c, &url).await;
    assert_eq!(r.status, 200);
    let etag = assert_etag(&r);
    assert_eq!(Some(etag.trim_matches('"')), url.split("hash=").nth(1), "the ETag is the hash");
    assert_eq!(r.header("cache-control").as_deref(), Some("public, immutable"));
    let expires = http_date(&r.header("expires").expect("Expires"));
    let days = (expires.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_days();
    assert!((364..=366).contains(&days), "a year ahead: {expires}");
    assert!(r.header("last-modified").is_some());
    assert!(r.header_all("vary").iter().any(|v| v == "Accept"));
    let r304 = call(&c, Method::GET, &url, &[("if-none-match", &etag)], vec![]).await;
    assert_eq!(r304.status, 304);
    assert_eq!(r304.header("cache-control").as_deref(), Some("public, immutable"));

    // Without a hash: revalidated each time; a stale hash: 301 to the current URL.
    let r = get(&c, "/openapi/v3/apis/core.gardener.cloud/v1beta1").await;
    assert_eq!((r.status, r.header("cache-control").as_deref()), (200, Some("no-cache, private")));
    assert!(r.header("expires").is_none());
    let r = get(&c, "/openapi/v3/apis/core.gardener.cloud/v1beta1?hash=ABC").await;
    assert_eq!((r.status, r.header("location").as_deref()), (301, Some(url.as_str())));
}

/// k8s.io/apiserver lists a group version's resources in the sorted order of their paths, in both discovery forms.
#[tokio::test]
async fn resource_lists_are_sorted() {
    let s = Server::start(&[]);
    let c = s.client().await;
    for gv in ["migration.k8s.io/v1alpha1", "core.gardener.cloud/v1beta1", "core.gardener.cloud/v1alpha1"] {
        let list = get(&c, &format!("/apis/{gv}")).await.ok(200);
        let names: Vec<String> = list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| r["name"].as_str().unwrap().into())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "{gv}");
        assert!(!names.is_empty());
    }
    let agg = get_accept(&c, "/apis", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList").await;
    for group in agg.ok(200)["items"].as_array().expect("items") {
        for version in group["versions"].as_array().expect("versions") {
            let names: Vec<&str> = version["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .filter_map(|r| r["resource"].as_str())
                .collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(names, sorted, "{group}");
        }
    }
    // ShootState is in the `all` category, as Gardener declares it.
    let shootstates = get(&c, "/apis/core.gardener.cloud/v1beta1").await.ok(200)["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "shootstates")
        .cloned()
        .expect("shootstates");
    assert_eq!(shootstates["categories"], json!(["all"]));
}

#[test]
fn kubectl_get_all_lists_shootstates() {
    let s = Server::start(&[]);
    let ss = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                    "metadata": {"name": "crew", "namespace": "garden-all"}, "spec": {}});
    let out = s.kubectl_stdin(&["create", "-f", "-"], &ss.to_string());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = s.kubectl_ok(&["get", "all", "-n", "garden-all", "-o", "name"]);
    assert_eq!(all.trim(), "shootstate.core.gardener.cloud/crew");
    // Other namespaces' ShootStates stay out; the category holds nothing else of ours.
    assert_eq!(s.kubectl_ok(&["get", "all", "-n", "garden-other", "-o", "name"]).trim(), "");
}

/// kubectl keeps the OpenAPI documents in its HTTP cache: a second explain revalidates the root (304) and reads the
/// group version's hash URL from the cache, so no document is downloaded again.
#[test]
fn a_second_kubectl_explain_downloads_nothing() {
    let s = Server::start(&[]);
    let proxy = Proxy::start(&s);
    let explain = || {
        let out = kubectl_with(&proxy.kubeconfig(), &["explain", "shootstates.spec.gardener"], None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = explain();
    assert!(first.contains("GardenerResourceData"), "{first}");
    let openapi = |records: Vec<common::proxy::Record>| -> Vec<(String, u16)> {
        records.into_iter().filter(|r| r.path.starts_with("/openapi")).map(|r| (r.path, r.code)).collect()
    };
    let downloaded = openapi(proxy.records());
    assert!(downloaded.iter().any(|(p, code)| p.starts_with("/openapi/v3/apis/") && *code == 200), "{downloaded:?}");
    proxy.clear_records();

    assert_eq!(explain(), first);
    let again = openapi(proxy.records());
    assert!(again.iter().all(|(_, code)| *code == 304), "nothing downloaded again: {again:?}");
}
