//! The `kms` provider's configuration checks, with kube-apiserver's field paths and messages.

use crate::storage::encryption::EncryptionConfig;

fn config(providers: &str) -> String {
    format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  \
         providers:\n{providers}"
    )
}

fn kms(fields: &str) -> String {
    let mut s = "  - kms:\n".to_string();
    for line in fields.lines() {
        s += &format!("      {line}\n");
    }
    s
}

fn err(yaml: &str) -> String {
    EncryptionConfig::from_yaml(yaml).expect_err("must be refused").to_string()
}

const OK: &str = "apiVersion: v2\nname: p1\nendpoint: unix:///tmp/kms.sock";

#[test]
fn a_v2_provider_writes_and_reads_its_resources() {
    let c = EncryptionConfig::from_yaml(&config(&kms(OK))).expect("config");
    assert!(c.has_kms());
    assert_eq!(c.write_key_for_resource("secrets"), "kms:v2:p1");
    assert!(c.reads_for_resource("secrets", "kms:v2:p1"));
    let abstract_socket = EncryptionConfig::from_yaml(&config(&kms("apiVersion: v2\nname: p\nendpoint: unix:///@kms")));
    assert!(abstract_socket.is_ok());
    let with_timeout = config(&kms("apiVersion: v2\nname: p\nendpoint: unix:///@kms\ntimeout: 500ms"));
    assert!(EncryptionConfig::from_yaml(&with_timeout).is_ok());
}

#[test]
fn kms_v1_and_bad_fields_are_refused_as_kube_apiserver_refuses_them() {
    let field = "resources[0].providers[0].kms";
    let cases = [
        ("name: p\nendpoint: unix:///tmp/k.sock", format!("{field}.apiVersion: KMSv1 is deprecated and will only receive security updates going forward. Use KMSv2 instead.")),
        ("apiVersion: v3\nname: p\nendpoint: unix:///tmp/k.sock", format!("{field}.apiVersion: Invalid value: \"v3\": unsupported apiVersion apiVersion for KMS provider, only v1 and v2 are supported")),
        ("apiVersion: v2\nendpoint: unix:///tmp/k.sock", format!("{field}.name: Required value: name is a mandatory field for a provider")),
        ("apiVersion: v2\nname: a:b\nendpoint: unix:///tmp/k.sock", format!("{field}.name: Invalid value: \"a:b\": invalid KMS provider name a:b, must not contain ':'")),
        ("apiVersion: v2\nname: p", format!("{field}.endpoint: Invalid value: \"\": endpoint is a mandatory field for a kms")),
        ("apiVersion: v2\nname: p\nendpoint: tcp://127.0.0.1:80", format!("{field}.endpoint: Invalid value: \"tcp://127.0.0.1:80\": unsupported scheme \"tcp\" for KMS provider, only unix is supported")),
        ("apiVersion: v2\nname: p\nendpoint: unix:///tmp/k.sock\ntimeout: 0s", format!("{field}.timeout: Invalid value: \"0s\": timeout should be a positive value")),
        ("apiVersion: v2\nname: p\nendpoint: unix:///tmp/k.sock\ncachesize: 1000", format!("{field}.cachesize: Invalid value: 1000: cachesize is not supported in v2")),
        ("apiVersion: v2\nname: p\nendpoint: unix:///tmp/k.sock\nsize: 1", "unknown field `size`".to_string()),
    ];
    for (fields, want) in cases {
        let e = err(&config(&kms(fields)));
        assert!(e.contains(&want), "{fields}:\n{e}\nshould contain\n{want}");
    }
}

#[test]
fn names_are_unique_across_kms_providers() {
    let two = format!("{}{}", kms(OK), kms("apiVersion: v2\nname: p1\nendpoint: unix:///tmp/other.sock"));
    let e = err(&config(&two));
    assert!(
        e.contains("resources[0].providers[1].kms.name: Invalid value: \"p1\": duplicate KMS provider name p1, names must be unique"),
        "{e}"
    );
}

#[test]
fn before_the_first_good_status_the_provider_refuses_reads_and_writes_clearly() {
    let c = EncryptionConfig::from_yaml(&config(&kms(OK))).expect("config");
    let e = c.encrypt("/registry/secrets/ns/a", b"x").expect_err("no write state yet").to_string();
    assert!(e.contains("got unexpected nil transformer") && e.contains("\"p1\""), "{e}");
    let stored = bytes::Bytes::from_static(b"k8s:enc:kms:v2:p1:\x0a\x01\x00");
    let e = c.decrypt("/registry/secrets/ns/a", &stored).expect_err("no write state yet").to_string();
    assert!(e.contains("got unexpected nil transformer"), "{e}");
}
