//! apimachinery's name, label and annotation validators through the REST API of every kind, against the real
//! binary: each upstream table's good values are created (201) and each bad one is a 422 `Invalid` whose
//! `details.causes` are exactly kube-apiserver's (reason, field, message) and whose message lists them.
//!
//! The tables come from kubernetes/apimachinery at eed236ce (v0.37; the same since v0.35):
//! - names: pkg/util/validation/validation_test.go `TestIsDNS1123Subdomain` and `TestIsDNS1123Label`, through the
//!   rule each kind's strategy uses (generic.go's `NameIsDNSSubdomain` for the migration kinds and events.k8s.io
//!   Events, `NameIsDNSLabel` for Namespaces and Gardener's ShootState, only content.IsPathSegmentName for core/v1
//!   Events, whose strategy validates no metadata);
//! - generateName: pkg/api/validation/objectmeta_test.go `TestValidateObjectMetaTrimsTrailingDash` and generic.go's
//!   `maskTrailingDash` (the dash and the character before it become one `a`);
//! - labels: pkg/apis/meta/v1/validation/validation_test.go `TestValidateLabels`, with validation_test.go's
//!   `TestIsQualifiedName` and `TestIsValidLabelValue` for more keys and values;
//! - annotations: pkg/api/validation/objectmeta_test.go `TestValidateAnnotations`;
//! - kind fields validated with the same functions: storagemigration.k8s.io `spec.resource` (kubernetes/kubernetes
//!   pkg/apis/storagemigration/validation: IsDNS1035Label and IsDNS1123Subdomain, messages joined by ",") and an
//!   Event's `reportingController` (pkg/apis/core/validation/events.go: IsQualifiedName).
//!
//! One server per kind; every request is answered before the next is sent.

mod common;
use common::requests::post;
use common::*;
use serde_json::{json, Value};

const SUBDOMAIN_REGEX: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const LABEL_REGEX: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1035_REGEX: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
const NAME_PART_REGEX: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_KEY_REGEX: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
const LABEL_VALUE_REGEX: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
const SUBDOMAIN_TOO_LONG: &str = "must be no more than 253 characters";
const LABEL_TOO_LONG: &str = "must be no more than 63 characters";
const NO_DOTS: &str = "must not contain dots";
const LABEL_VALUE_TOO_LONG: &str = "must be no more than 63 bytes";
/// pkg/api/validation/objectmeta.go's `TotalAnnotationSizeLimitB`.
const ANNOTATIONS_LIMIT: usize = 256 * 1024;
/// apimachinery's name generator: the base cut to 58 bytes, then 5 characters of this alphabet.
const GENERATED_BASE_MAX: usize = 58;
const SUFFIX_ALPHABET: &str = "bcdfghjklmnpqrstvwxz2456789";

fn a(n: usize) -> String {
    "a".repeat(n)
}

/// `%q` of the printable strings these tables use (Go and JSON agree on them).
fn q(s: &str) -> String {
    assert!(s.chars().all(|c| !c.is_control()), "{s:?}: the tables use printable values");
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The name syntax a kind's strategy checks.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rule {
    Subdomain,
    Label,
    PathSegment,
}

/// A cause of a 422: reason, field and message (the message as kube-apiserver sends it, without the field). A
/// generated name is matched by its base and the detail after it.
#[derive(Clone, Debug)]
enum Cause {
    Exact(&'static str, String, String),
    GeneratedName { base: String, detail: String },
}

fn invalid(field: &str, value: &str, detail: &str) -> Cause {
    Cause::Exact("FieldValueInvalid", field.into(), format!("Invalid value: {}: {detail}", q(value)))
}

fn name_invalid(name: &str, details: &[&str]) -> Vec<Cause> {
    details.iter().map(|d| invalid("metadata.name", name, d)).collect()
}

fn generated_invalid(generate_name: &str, detail: &str) -> Cause {
    let base: String = generate_name.bytes().take(GENERATED_BASE_MAX).map(char::from).collect();
    Cause::GeneratedName { base, detail: detail.into() }
}

impl Cause {
    fn matches(&self, got: &Value) -> bool {
        let (reason, field, message) = (&got["reason"], &got["field"], got["message"].as_str().unwrap_or_default());
        match self {
            Cause::Exact(r, f, m) => reason == r && field == f.as_str() && message == m,
            Cause::GeneratedName { base, detail } => {
                let Some(rest) = message.strip_prefix(&format!("Invalid value: \"{base}")) else { return false };
                let Some(suffix) = rest.strip_suffix(&format!("\": {detail}")) else { return false };
                reason == "FieldValueInvalid"
                    && field == "metadata.name"
                    && suffix.len() == 5
                    && suffix.chars().all(|c| SUFFIX_ALPHABET.contains(c))
            }
        }
    }
    fn exact_message(&self) -> Option<String> {
        match self {
            Cause::Exact(_, f, m) => Some(format!("{f}: {m}")),
            Cause::GeneratedName { .. } => None,
        }
    }
}

/// One create: the object's metadata (and what else the case sets), where it comes from upstream, and its answer.
struct Case {
    source: String,
    metadata: Value,
    /// Top-level fields set over the kind's valid object (a merge patch).
    patch: Value,
    want: Result<(), Vec<Cause>>,
}

/// A kind under test: where it is created, how a valid object of it reads, and what its 422s say.
struct KindUnderTest {
    path: &'static str,
    /// `GroupKind.String()`, the start of a 422's message.
    qualified: &'static str,
    kind: &'static str,
    group: &'static str,
    namespace: Option<&'static str>,
    rule: Rule,
    /// A valid object with this metadata.
    object: fn(&Value) -> Value,
}

impl KindUnderTest {
    /// A case with metadata `metadata` (the kind's namespace added) and nothing else changed.
    fn case(&self, source: impl Into<String>, metadata: Value, want: Result<(), Vec<Cause>>) -> Case {
        let mut metadata = metadata;
        if let Some(ns) = self.namespace {
            metadata["namespace"] = json!(ns);
        }
        Case { source: source.into(), metadata, patch: json!({}), want }
    }

    async fn run(&self, s: &Server, cases: Vec<Case>) {
        let c = s.client().await;
        let mut failures = Vec::new();
        for case in &cases {
            let mut body = (self.object)(&case.metadata);
            json_patch::merge(&mut body, &case.patch);
            let resp = post(&c, self.path, &body).await;
            if let Err(problem) = self.check(case, &resp) {
                failures.push(format!("{} ({}): {problem}", case.source, case.metadata));
            }
        }
        assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
    }

    fn check(&self, case: &Case, resp: &common::requests::Resp) -> Result<(), String> {
        let Err(want) = &case.want else {
            return match resp.status {
                201 => Ok(()),
                code => Err(format!("expected 201, got {code}: {}", resp.text())),
            };
        };
        if resp.status != 422 {
            return Err(format!("expected 422, got {}: {}", resp.status, resp.text()));
        }
        let st = resp.json();
        let causes = st["details"]["causes"].as_array().cloned().unwrap_or_default();
        let all_match = causes.len() == want.len() && want.iter().zip(&causes).all(|(w, g)| w.matches(g));
        let failure = st["kind"] == "Status" && st["code"] == 422 && st["reason"] == "Invalid";
        if !failure || !all_match {
            return Err(format!("expected causes {want:?}, got {st}"));
        }
        // The group is left out for the core group, as Go's omitempty leaves it.
        let group = st["details"]["group"].as_str().unwrap_or_default();
        if (st["details"]["kind"].as_str(), group) != (Some(self.kind), self.group) {
            return Err(format!("details name the kind {}/{}: {st}", self.group, self.kind));
        }
        // The name in the details and the message: the object's, or the one generated for it.
        let name = st["details"]["name"].as_str().unwrap_or_default();
        let named = match (case.metadata["name"].as_str(), case.metadata["generateName"].as_str()) {
            (Some(given), _) => name == given,
            (None, Some(base)) => name.starts_with(&base[..base.len().min(GENERATED_BASE_MAX)]),
            (None, None) => name.is_empty(),
        };
        if !named {
            return Err(format!("details name another object: {st}"));
        }
        // The message: `<Kind.group> "<name>" is invalid: <cause>`, or `[<cause>, ...]` each message once.
        if let Some(mut messages) = want.iter().map(Cause::exact_message).collect::<Option<Vec<String>>>() {
            let mut seen = std::collections::HashSet::new();
            messages.retain(|m| seen.insert(m.clone()));
            let list = match &messages[..] {
                [one] => one.clone(),
                many => format!("[{}]", many.join(", ")),
            };
            let message = format!("{} {} is invalid: {list}", self.qualified, q(name));
            if st["message"] != message.as_str() {
                return Err(format!("expected message {message:?}, got {st}"));
            }
        }
        Ok(())
    }
}

/// A name's validity under each rule, as its validator answers.
#[derive(Clone, Copy)]
enum Is {
    Ok,
    Regex,
    TooLong,
    TooLongAndRegex,
    Dots,
    TooLongAndDots,
}

fn name_details(rule: Rule, is: Is) -> Vec<&'static str> {
    let (too_long, regex) = match rule {
        Rule::Subdomain => (SUBDOMAIN_TOO_LONG, SUBDOMAIN_REGEX),
        _ => (LABEL_TOO_LONG, LABEL_REGEX),
    };
    match is {
        Is::Ok => vec![],
        Is::Regex => vec![regex],
        Is::TooLong => vec![too_long],
        Is::TooLongAndRegex => vec![too_long, regex],
        Is::Dots => vec![NO_DOTS],
        Is::TooLongAndDots => vec![too_long, NO_DOTS],
    }
}

/// Names as `TestIsDNS1123Subdomain` and `TestIsDNS1123Label` have them, with what IsDNS1123Subdomain and
/// IsDNS1123Label say of each (a subdomain with dots is "must not contain dots" to the label), what IsValidLabelValue
/// says (a Namespace's name is copied to its `kubernetes.io/metadata.name` label), and its source.
fn names() -> Vec<(String, Is, Is, Vec<&'static str>, &'static str)> {
    use Is::*;
    const LABEL: &str = "validation_test.go TestIsDNS1123Label bad";
    const SUB: &str = "validation_test.go TestIsDNS1123Subdomain bad";
    let lv_long = || vec![LABEL_VALUE_TOO_LONG];
    let lv_regex = || vec![LABEL_VALUE_REGEX];
    let mut rows: Vec<(String, Is, Is, Vec<&'static str>, &'static str)> = Vec::new();
    for n in ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2"] {
        rows.push((n.into(), Ok, Ok, vec![], "validation_test.go TestIsDNS1123Label/TestIsDNS1123Subdomain good"));
    }
    rows.push((a(63), Ok, Ok, vec![], "TestIsDNS1123Label good: 63"));
    for n in [
        "a.a",
        "ab.a",
        "abc.a",
        "a1.a",
        "a-1.a",
        "a--1--2--b.a",
        "a.1",
        "ab.1",
        "abc.1",
        "a1.1",
        "a-1.1",
        "a--1--2--b.1",
        "0.a",
        "01.a",
        "012.a",
        "1a.a",
        "1-a.a",
        "0.1",
        "01.1",
        "012.1",
        "1a.1",
        "1-a.1",
        "1--a--b--2.1",
        "a.b.c.d.e",
        "aa.bb.cc.dd.ee",
        "1.2.3.4.5",
        "11.22.33.44.55",
    ] {
        rows.push((n.into(), Ok, Dots, vec![], "validation_test.go TestIsDNS1123Subdomain good"));
    }
    rows.push((a(253), Ok, TooLong, lv_long(), "TestIsDNS1123Subdomain good: 253"));
    rows.push((a(254), TooLong, TooLong, lv_long(), "TestIsDNS1123Subdomain bad: 254"));
    rows.push((a(64), Ok, TooLong, lv_long(), "TestIsDNS1123Label bad: 64, a subdomain of one 64-byte part"));
    rows.push((format!("{}.b", a(100)), Ok, TooLongAndDots, lv_long(), "a subdomain part longer than a label"));
    rows.push((
        format!("{}-", a(253)),
        TooLongAndRegex,
        TooLongAndRegex,
        vec![LABEL_VALUE_TOO_LONG, LABEL_VALUE_REGEX],
        "254 with a trailing dash: both messages",
    ));
    for n in ["A", "ABC", "aBc", "A1", "A-1", "1-A", "a_b", "1_2"] {
        rows.push((n.into(), Regex, Regex, vec![], LABEL));
    }
    for n in ["-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "1_", "_1", ".", "a.", ".a", "1.", ".1"] {
        rows.push((n.into(), Regex, Regex, lv_regex(), LABEL));
    }
    for n in [" ", "a ", " a", "a b", "1 ", " 1", "1 2"] {
        rows.push((n.into(), Regex, Regex, lv_regex(), LABEL));
    }
    for n in ["a.b", "1.2"] {
        rows.push((n.into(), Ok, Dots, vec![], LABEL));
    }
    for n in [
        "a..b",
        "1..2",
        "A.a",
        "aB.a",
        "ab.A",
        "A1.a",
        "a1.A",
        "A.1",
        "aB.1",
        "A1.1",
        "1A.1",
        "0.A",
        "01.A",
        "012.A",
        "1A.a",
        "1a.A",
        "A.B.C.D.E",
        "AA.BB.CC.DD.EE",
        "a.B.c.d.e",
        "aa.bB.cc.dd.ee",
    ] {
        rows.push((n.into(), Regex, Regex, vec![], SUB));
    }
    for n in ["a@b", "a,b", "a;b", "a:b", "a%b", "a?b", "a$b"] {
        rows.push((n.into(), Regex, Regex, lv_regex(), SUB));
    }
    rows
}

/// The name table through `k`'s rule.
fn name_cases(k: &KindUnderTest) -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, subdomain, label, label_value, source) in names() {
        let mut want: Vec<Cause> = match k.rule {
            Rule::Subdomain => name_invalid(&name, &name_details(Rule::Subdomain, subdomain)),
            Rule::Label => name_invalid(&name, &name_details(Rule::Label, label)),
            // content.IsPathSegmentName: of these, only "." and "a%b" are refused.
            Rule::PathSegment if name == "." => name_invalid(&name, &["may not be '.'"]),
            Rule::PathSegment if name.contains('%') => name_invalid(&name, &["may not contain '%'"]),
            Rule::PathSegment => vec![],
        };
        // A Namespace's name is defaulted into its `kubernetes.io/metadata.name` label before validation.
        if k.kind == "Namespace" {
            want.extend(label_value.iter().map(|d| invalid("metadata.labels", &name, d)));
        }
        let want = if want.is_empty() { Ok(()) } else { Err(want) };
        cases.push(k.case(format!("name: {source}"), json!({"name": name}), want));
    }
    cases.push(k.case(
        "name: objectmeta.go ValidateObjectMetaAccessor, no name",
        json!({}),
        Err(vec![Cause::Exact(
            "FieldValueRequired",
            "metadata.name".into(),
            "Required value: name or generateName is required".into(),
        )]),
    ));
    if k.rule == Rule::PathSegment {
        // content/path.go IsPathSegmentName: what is refused, and that no DNS rule applies.
        for (name, details) in
            [("..", &["may not be '..'"][..]), ("a/b%", &["may not contain '/'", "may not contain '%'"])]
        {
            cases.push(k.case(
                "name: content/path.go IsPathSegmentName",
                json!({"name": name}),
                Err(name_invalid(name, details)),
            ));
        }
        for name in ["Bad_Name", "...", &a(300)] {
            cases.push(k.case("name: content/path.go IsPathSegmentName, no DNS rule", json!({"name": name}), Ok(())));
        }
    }
    cases
}

/// generateName: the kind's rule with `prefix`, on the whole generateName; the name generated from its first 58
/// bytes is then checked as any name.
fn generate_name_cases(k: &KindUnderTest) -> Vec<Case> {
    let mut cases = Vec::new();
    let gen = |g: &str| json!({"generateName": g});
    let source = |what: &str| format!("generateName: {what}");
    let gen_invalid = |g: &str, details: &[&str]| -> Vec<Cause> {
        details.iter().map(|d| invalid("metadata.generateName", g, d)).collect()
    };
    if k.rule == Rule::PathSegment {
        // IsPathSegmentPrefix: only '/' and '%'; the generated name is then refused too.
        cases.push(k.case(source("IsPathSegmentPrefix"), gen("Bad_"), Ok(())));
        cases.push(k.case(source("IsPathSegmentPrefix"), gen(".."), Ok(())));
        let mut want = gen_invalid("a/", &["may not contain '/'"]);
        want.push(generated_invalid("a/", "may not contain '/'"));
        cases.push(k.case(source("IsPathSegmentPrefix"), gen("a/"), Err(want)));
        return cases;
    }
    let (regex, too_long, max) = match k.rule {
        Rule::Subdomain => (SUBDOMAIN_REGEX, SUBDOMAIN_TOO_LONG, 253),
        _ => (LABEL_REGEX, LABEL_TOO_LONG, 63),
    };
    cases.push(k.case(source("objectmeta_test.go TestValidateObjectMetaTrimsTrailingDash"), gen("foo-"), Ok(())));
    cases.push(k.case(source("no trailing dash"), gen("foo"), Ok(())));
    // maskTrailingDash: `name[:len(name)-2] + "a"`, so the character before the dash is never checked (the name
    // generated from it is), a lone dash is not masked, and the length is checked one byte short.
    cases.push(k.case(
        source("maskTrailingDash, the character before the dash"),
        gen("A-"),
        Err(vec![generated_invalid("A-", regex)]),
    ));
    let mut want = gen_invalid("-", &[regex]);
    want.push(generated_invalid("-", regex));
    cases.push(k.case(source("maskTrailingDash, a lone dash"), gen("-"), Err(want)));
    let mut want = gen_invalid("Bad_", &[regex]);
    want.push(generated_invalid("Bad_", regex));
    cases.push(k.case(source("generic.go NameIsDNS*(prefix)"), gen("Bad_"), Err(want)));
    let longest = format!("{}-", a(max));
    cases.push(k.case(source("maskTrailingDash, one byte over the limit"), gen(&longest), Ok(())));
    let over = format!("{}-", a(max + 1));
    cases.push(k.case(
        source("maskTrailingDash, two bytes over the limit"),
        gen(&over),
        Err(gen_invalid(&over, &[too_long])),
    ));
    if k.rule == Rule::Label {
        // A dotted prefix: a subdomain, so "must not contain dots".
        let mut want = gen_invalid("a.b-", &[NO_DOTS]);
        want.push(generated_invalid("a.b-", NO_DOTS));
        cases.push(k.case(source("IsDNS1123Label of a subdomain"), gen("a.b-"), Err(want)));
    }
    cases
}

/// `TestValidateLabels`, `TestIsQualifiedName`, `TestIsValidLabelValue`: each label on an object of its own.
fn label_cases(k: &KindUnderTest) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut n = 0;
    let mut add = |source: &str, key: &str, value: &str, want: Vec<Cause>| {
        n += 1;
        let metadata = json!({"name": format!("labels-{n}"), "labels": {key: value}});
        let want = if want.is_empty() { Ok(()) } else { Err(want) };
        cases.push(k.case(format!("labels: {source}"), metadata, want));
    };
    let key_invalid = |key: &str, details: &[&str]| -> Vec<Cause> {
        details.iter().map(|d| invalid("metadata.labels", key, d)).collect()
    };
    let long_prefix = format!("{}/{}", a(253), "b".repeat(63));
    for key in [
        "simple",
        "now-with-dashes",
        "1-starts-with-num",
        "1234",
        "simple/simple",
        "now-with-dashes/simple",
        "now-with-dashes/now-with-dashes",
        "now.with.dots/simple",
        "now-with.dashes-and.dots/simple",
        "1-num.2-num/3-num",
        "1234/5678",
        "1.2.3.4/5678",
        "UpperCaseAreOK123",
    ] {
        add("meta/v1 validation_test.go TestValidateLabels success", key, "bar", vec![]);
    }
    add("TestValidateLabels success", "goodvalue", "123_-.BaR", vec![]);
    for key in ["Uppercase_Is_OK_123", "example.com/Uppercase_Is_OK_123", "requests.storage-foo", &a(63), &long_prefix]
    {
        add("validation_test.go TestIsQualifiedName success", key, "bar", vec![]);
    }
    for value in ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", &a(63), ""] {
        add("validation_test.go TestIsValidLabelValue success", "key", value, vec![]);
    }
    let key_errors: Vec<(String, Vec<&str>, &str)> = vec![
        ("nospecialchars^=@".into(), vec![NAME_PART_REGEX], "TestValidateLabels labelNameErrorCases"),
        ("cantendwithadash-".into(), vec![NAME_PART_REGEX], "TestValidateLabels labelNameErrorCases"),
        ("only/one/slash".into(), vec![LABEL_KEY_REGEX], "TestValidateLabels labelNameErrorCases"),
        (a(254), vec!["name part must be no more than 63 bytes"], "TestValidateLabels labelNameErrorCases"),
        ("nospecialchars%^=@".into(), vec![NAME_PART_REGEX], "TestIsQualifiedName errorCases"),
        ("-cantstartwithadash-".into(), vec![NAME_PART_REGEX], "TestIsQualifiedName errorCases"),
        ("Example.com/abc".into(), vec![], "TestIsQualifiedName errorCases"),
        ("example_com/abc".into(), vec![], "TestIsQualifiedName errorCases"),
        ("example.com/".into(), vec!["name part must be non-empty", NAME_PART_REGEX], "TestIsQualifiedName errorCases"),
        ("/simple".into(), vec!["prefix part must be non-empty"], "TestIsQualifiedName errorCases"),
        (a(64), vec!["name part must be no more than 63 bytes"], "TestIsQualifiedName errorCases"),
        (
            format!("{}/abc", a(254)),
            vec!["prefix part must be no more than 253 bytes"],
            "TestIsQualifiedName errorCases",
        ),
    ];
    let prefix_regex = format!("prefix part {SUBDOMAIN_REGEX}");
    for (key, details, source) in &key_errors {
        let details: Vec<&str> = if details.is_empty() { vec![&prefix_regex] } else { details.clone() };
        add(source, key, "bar", key_invalid(key, &details));
    }
    let value_errors: Vec<(String, &str, &str)> = vec![
        (a(64), "must be no more than 63 bytes", "TestValidateLabels labelValueErrorCases"),
        ("some\\bad\\value".into(), LABEL_VALUE_REGEX, "TestValidateLabels labelValueErrorCases"),
        ("bad,value".into(), LABEL_VALUE_REGEX, "TestValidateLabels labelValueErrorCases"),
        ("?#$notsogood".into(), LABEL_VALUE_REGEX, "TestValidateLabels labelValueErrorCases"),
        ("nospecialchars%^=@".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
        ("Tama-nui-te-rā.is.Māori.sun".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
        ("\\backslashes\\are\\bad".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
        ("-starts-with-dash".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
        ("ends-with-dash-".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
        (".starts.with.dot".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
        ("ends.with.dot.".into(), LABEL_VALUE_REGEX, "TestIsValidLabelValue errorCases"),
    ];
    for (value, detail, source) in &value_errors {
        // ValidateLabels reports a value at the map, not at the key.
        add(source, "key", value, vec![invalid("metadata.labels", value, detail)]);
    }
    // A key and its value both bad: the key's problems first.
    add(
        "ValidateLabels",
        "-k",
        "-v",
        vec![invalid("metadata.labels", "-k", NAME_PART_REGEX), invalid("metadata.labels", "-v", LABEL_VALUE_REGEX)],
    );
    cases
}

/// `TestValidateAnnotations`: keys are qualified names once lower-cased, and keys and values total at most 256 KiB.
fn annotation_cases(k: &KindUnderTest) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut n = 0;
    let mut add = |source: &str, annotations: Value, want: Vec<Cause>| {
        n += 1;
        let metadata = json!({"name": format!("annotations-{n}"), "annotations": annotations});
        let want = if want.is_empty() { Ok(()) } else { Err(want) };
        cases.push(k.case(format!("annotations: objectmeta_test.go TestValidateAnnotations {source}"), metadata, want));
    };
    for key in [
        "simple",
        "now-with-dashes",
        "1-starts-with-num",
        "1234",
        "simple/simple",
        "now-with-dashes/simple",
        "now-with-dashes/now-with-dashes",
        "now.with.dots/simple",
        "now-with.dashes-and.dots/simple",
        "1-num.2-num/3-num",
        "1234/5678",
        "1.2.3.4/5678",
        "UpperCase123",
        // Lower-cased before the check: an upper-case prefix is fine here (not in a label key).
        "Example.COM/abc",
    ] {
        add("successCases", json!({key: "bar"}), vec![]);
    }
    add("successCases: one under the limit", json!({"a": "b".repeat(ANNOTATIONS_LIMIT - 1)}), vec![]);
    let half = "b".repeat(ANNOTATIONS_LIMIT / 2 - 1);
    add("successCases: two under the limit", json!({"a": half, "c": half}), vec![]);
    for (key, detail) in [
        ("nospecialchars^=@".to_string(), NAME_PART_REGEX),
        ("cantendwithadash-".into(), NAME_PART_REGEX),
        ("only/one/slash".into(), LABEL_KEY_REGEX),
        (a(254), "name part must be no more than 63 bytes"),
        // Shown as written, checked lower-cased.
        ("A/B/C".into(), LABEL_KEY_REGEX),
    ] {
        add("nameErrorCases", json!({&key: "bar"}), vec![invalid("metadata.annotations", &key, detail)]);
    }
    let too_long = || {
        vec![Cause::Exact(
            "FieldValueTooLong",
            "metadata.annotations".into(),
            format!("Too long: may not be more than {ANNOTATIONS_LIMIT} bytes"),
        )]
    };
    add("totalSizeErrorCases: one", json!({"a": "b".repeat(ANNOTATIONS_LIMIT)}), too_long());
    let half = "b".repeat(ANNOTATIONS_LIMIT / 2);
    add("totalSizeErrorCases: two", json!({"a": half, "c": half}), too_long());
    cases
}

fn all_cases(k: &KindUnderTest) -> Vec<Case> {
    let mut cases = name_cases(k);
    cases.extend(generate_name_cases(k));
    cases.extend(label_cases(k));
    cases.extend(annotation_cases(k));
    cases
}

fn with_metadata(mut object: Value, metadata: &Value) -> Value {
    object["metadata"] = metadata.clone();
    object
}

#[tokio::test]
async fn migration_storage_version_migration() {
    let k = KindUnderTest {
        path: "/apis/migration.k8s.io/v1alpha1/storageversionmigrations",
        qualified: "StorageVersionMigration.migration.k8s.io",
        kind: "StorageVersionMigration",
        group: "migration.k8s.io",
        namespace: None,
        rule: Rule::Subdomain,
        object: |m| {
            with_metadata(
                json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
                       "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}}}),
                m,
            )
        },
    };
    let s = Server::start(&[]);
    k.run(&s, all_cases(&k)).await;
}

#[tokio::test]
async fn migration_storage_state() {
    // A StorageState's name is `<resource>.<group>` of its spec: the resource is the name (core group), so each
    // name is checked as a name only; a generated name cannot agree, which the kind then says.
    let k = KindUnderTest {
        path: "/apis/migration.k8s.io/v1alpha1/storagestates",
        qualified: "StorageState.migration.k8s.io",
        kind: "StorageState",
        group: "migration.k8s.io",
        namespace: None,
        rule: Rule::Subdomain,
        object: |m| {
            let resource = m["name"].as_str().filter(|n| !n.is_empty()).unwrap_or("things");
            with_metadata(
                json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
                       "spec": {"resource": {"group": "", "resource": resource}}}),
                m,
            )
        },
    };
    let mismatch = "must be \"things\": the name of a StorageState is <resource>.<group> of spec.resource (<resource> for the core group)";
    let mut cases = name_cases(&k);
    for mut case in generate_name_cases(&k) {
        let generate_name = case.metadata["generateName"].as_str().unwrap_or_default().to_string();
        let mut want = case.want.err().unwrap_or_default();
        // The kind's own check follows the metadata's (when the generated name is a valid one, it is the only one).
        want.push(generated_invalid(&generate_name, mismatch));
        case.want = Err(want);
        cases.push(case);
    }
    cases.extend(label_cases(&k));
    cases.extend(annotation_cases(&k));
    let s = Server::start(&[]);
    k.run(&s, cases).await;
}

#[tokio::test]
async fn storagemigration_v1_storage_version_migration() {
    let k = KindUnderTest {
        path: "/apis/storagemigration.k8s.io/v1/storageversionmigrations",
        qualified: "StorageVersionMigration.storagemigration.k8s.io",
        kind: "StorageVersionMigration",
        group: "storagemigration.k8s.io",
        namespace: None,
        rule: Rule::Subdomain,
        object: |m| {
            with_metadata(
                json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
                       "spec": {"resource": {"group": "apps", "resource": "deployments"}}}),
                m,
            )
        },
    };
    let mut cases = all_cases(&k);
    // spec.resource: the resource an IsDNS1035Label, the group an IsDNS1123Subdomain when set, each field's
    // messages joined by "," into one cause (pkg/apis/storagemigration/validation/validation.go).
    let spec = |n: usize, group: &str, resource: &str, want: Result<(), Vec<Cause>>| {
        let mut case = k.case(
            format!("spec.resource: storagemigration validation.go ValidateStorageVersionMigration ({n})"),
            json!({"name": format!("spec-{n}")}),
            want,
        );
        case.patch = json!({"spec": {"resource": {"group": group, "resource": resource}}});
        case
    };
    let long_resource = format!("{}-", a(63));
    cases.extend([
        spec(1, "", "configmaps", Ok(())),
        spec(2, &format!("{}.b", a(100)), &a(63), Ok(())),
        spec(3, "apps", &a(64), Err(vec![invalid("spec.resource.resource", &a(64), LABEL_TOO_LONG)])),
        spec(4, "apps", "1abc", Err(vec![invalid("spec.resource.resource", "1abc", DNS1035_REGEX)])),
        spec(
            5,
            "apps",
            &long_resource,
            Err(vec![invalid("spec.resource.resource", &long_resource, &format!("{LABEL_TOO_LONG},{DNS1035_REGEX}"))]),
        ),
        spec(6, "Bad_Group", "things", Err(vec![invalid("spec.resource.group", "Bad_Group", SUBDOMAIN_REGEX)])),
        spec(7, &a(254), "things", Err(vec![invalid("spec.resource.group", &a(254), SUBDOMAIN_TOO_LONG)])),
    ]);
    let s = Server::start(&[]);
    k.run(&s, cases).await;
}

#[tokio::test]
async fn gardener_shoot_state() {
    // gardener/gardener pkg/api/core/validation/shootstate.go: ValidateObjectMeta(meta, true, NameIsDNSLabel).
    let k = KindUnderTest {
        path: "/apis/core.gardener.cloud/v1beta1/namespaces/garden-dev/shootstates",
        qualified: "ShootState.core.gardener.cloud",
        kind: "ShootState",
        group: "core.gardener.cloud",
        namespace: Some("garden-dev"),
        rule: Rule::Label,
        object: |m| {
            with_metadata(json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState", "spec": {}}), m)
        },
    };
    let s = Server::start(&[]);
    k.run(&s, all_cases(&k)).await;
}

/// A core/v1 Event as an old client writes it: no eventTime, about a cluster-scoped object, in `default`.
fn core_event(metadata: &Value) -> Value {
    with_metadata(
        json!({"apiVersion": "v1", "kind": "Event", "involvedObject": {"kind": "Node", "name": "n"},
               "reason": "Seen", "message": "m", "type": "Normal"}),
        metadata,
    )
}

#[tokio::test]
async fn core_v1_event() {
    // pkg/apis/core/validation/events.go: for core/v1 only legacyValidateEvent; the name is then checked by
    // the generic registry as a path segment (k8s.io/apiserver pkg/registry/rest/create.go BeforeCreate).
    let k = KindUnderTest {
        path: "/api/v1/namespaces/default/events",
        qualified: "Event",
        kind: "Event",
        group: "",
        namespace: Some("default"),
        rule: Rule::PathSegment,
        object: core_event,
    };
    let mut cases = all_cases(&k);
    // The generic check runs only once the legacy checks passed: a bad name beside a legacy error is not reported.
    let mut case = k.case(
        "rest/create.go BeforeCreate: the strategy's errors alone",
        json!({"name": "a/b", "labels": {"-k": "v"}}),
        Err(vec![invalid("involvedObject.namespace", "elsewhere", "does not match event.namespace")]),
    );
    case.patch = json!({"involvedObject": {"namespace": "elsewhere"}});
    cases.push(case);
    // With an eventTime, legacyValidateEvent checks reportingController as IsQualifiedName, at the field's core/v1
    // name (its reportingControllerFieldName).
    let reporting = |n: usize, controller: &str, want: Result<(), Vec<Cause>>| {
        let mut case = k.case(
            format!("reportingController: events.go legacyValidateEvent ({n})"),
            json!({"name": format!("reporting-{n}")}),
            want,
        );
        case.patch = json!({"eventTime": "2026-01-01T00:00:00.000000Z", "reportingComponent": controller,
                            "reportingInstance": "i", "action": "Do"});
        case
    };
    cases.extend(reporting_cases("reportingComponent", reporting));
    let s = Server::start(&[]);
    k.run(&s, cases).await;
}

/// An Event's reporting controller: required and a qualified name, reported at `field` (`reportingController`, or
/// `reportingComponent` for a core/v1 request).
fn reporting_cases(field: &str, case: impl Fn(usize, &str, Result<(), Vec<Cause>>) -> Case) -> Vec<Case> {
    let at = |controller: &str, details: &[&str]| -> Vec<Cause> {
        details.iter().map(|d| invalid(field, controller, d)).collect()
    };
    let mut required = vec![Cause::Exact("FieldValueRequired", field.into(), "Required value".into())];
    required.extend(at("", &["name part must be non-empty", NAME_PART_REGEX]));
    vec![
        case(1, "migration.k8s.io/storage-version-migrator", Ok(())),
        case(2, "my-contr@ller", Err(at("my-contr@ller", &[NAME_PART_REGEX]))),
        case(3, "a/b/c", Err(at("a/b/c", &[LABEL_KEY_REGEX]))),
        case(4, "Example.com/x", Err(at("Example.com/x", &[&format!("prefix part {SUBDOMAIN_REGEX}")]))),
        case(5, "", Err(required)),
    ]
}

#[tokio::test]
async fn events_v1_event() {
    // pkg/apis/core/validation/events.go ValidateEventCreate for events.k8s.io/v1: legacyValidateEvent, then
    // ValidateObjectMeta(NameIsDNSSubdomain), then the new API's requirements.
    let k = KindUnderTest {
        path: "/apis/events.k8s.io/v1/namespaces/default/events",
        qualified: "Event.events.k8s.io",
        kind: "Event",
        group: "events.k8s.io",
        namespace: Some("default"),
        rule: Rule::Subdomain,
        object: |m| {
            with_metadata(
                json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "eventTime": "2026-01-01T00:00:00.000000Z",
                       "reportingController": "migration.k8s.io/storage-version-migrator", "reportingInstance": "i",
                       "action": "Do", "reason": "Seen", "type": "Normal", "regarding": {"kind": "Node", "name": "n"}}),
                m,
            )
        },
    };
    let mut cases = all_cases(&k);
    let reporting = |n: usize, controller: &str, want: Result<(), Vec<Cause>>| {
        let mut case = k.case(
            format!("reportingController: events.go legacyValidateEvent ({n})"),
            json!({"name": format!("reporting-{n}")}),
            want,
        );
        case.patch = json!({"reportingController": controller});
        case
    };
    cases.extend(reporting_cases("reportingController", reporting));
    // The order of ValidateEventCreate: the legacy checks, the metadata, the new API's fields.
    let mut case = k.case(
        "events.go ValidateEventCreate: the order of its checks",
        json!({"name": "Bad_Name"}),
        Err(vec![
            invalid("reportingController", "-x", NAME_PART_REGEX),
            invalid("metadata.name", "Bad_Name", SUBDOMAIN_REGEX),
            invalid("type", "", "has invalid value: Odd"),
        ]),
    );
    case.patch = json!({"reportingController": "-x", "type": "Odd"});
    cases.push(case);
    let s = Server::start(&[]);
    k.run(&s, cases).await;
}

#[tokio::test]
async fn namespace() {
    // pkg/apis/core/validation ValidateNamespace: ValidateObjectMeta(meta, false, ValidateNamespaceName), which is
    // NameIsDNSLabel; the name is defaulted into the `kubernetes.io/metadata.name` label first.
    let k = KindUnderTest {
        path: "/api/v1/namespaces",
        qualified: "Namespace",
        kind: "Namespace",
        group: "",
        namespace: None,
        rule: Rule::Label,
        object: |m| with_metadata(json!({"apiVersion": "v1", "kind": "Namespace"}), m),
    };
    let s = Server::start(&[]);
    k.run(&s, all_cases(&k)).await;
    // A generated name gets the label too (the namespace strategy's Canonicalize).
    let c = s.client().await;
    let created = post(&c, k.path, &(k.object)(&json!({"generateName": "gen-"}))).await.ok(201);
    let name = created["metadata"]["name"].as_str().expect("name");
    assert_eq!(created["metadata"]["labels"]["kubernetes.io/metadata.name"], name, "{created}");
}
