//! The name and label syntaxes of apimachinery, with its messages: what every kind's names, labels, annotation keys
//! and qualified names are checked against, and the KMS v2 envelope's annotation keys. A leaf, as apimachinery's
//! util/validation sits below apiserver: the registry, auth, audit and the storage's encryption all use it.

// The syntaxes below are apimachinery's as kube-apiserver 1.37 (apimachinery v0.37, unchanged since v0.35) checks
// them, with its messages: `IsDNS1123Label`, `IsDNS1123Subdomain` and `IsDNS1035Label` of pkg/util/validation
// (lengths in "characters"), `IsLabelKey` (= `IsQualifiedName`) and `IsLabelValue` of pkg/api/validate/content
// (lengths in "bytes", the prefix of a key checked with content's own `IsDNS1123Subdomain`), and the name
// functions of pkg/api/validation/generic.go. Every length is Go's `len`, in bytes.

const DNS1123_LABEL_MAX: usize = 63;
const DNS1123_SUBDOMAIN_MAX: usize = 253;
const DNS1035_LABEL_MAX: usize = 63;
const LABEL_KEY_NAME_MAX: usize = 63;
const LABEL_VALUE_MAX: usize = 63;
/// pkg/api/validation/objectmeta.go's `TotalAnnotationSizeLimitB`.
pub const TOTAL_ANNOTATION_SIZE: usize = 256 * 1024;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_KEY_ERR: &str =
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// `MaxLenError` of pkg/util/validation.
fn max_len_characters(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `MaxLenError` of pkg/api/validate/content.
fn max_len_bytes(n: usize) -> String {
    format!("must be no more than {n} bytes")
}

/// `RegexError`: the message, then the examples and the regex in parentheses. Go's loop writes each example as
/// `'x', ` and puts ` or ` before every one but the first, hence the two spaces in `'a',  or 'b'`.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn is_alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// Whether all of `s` matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (no length limit: Go's regex has none).
fn dns1123_label_matches(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

/// Whether all of `s` matches the subdomain regex: dot-separated labels, each of any length.
fn dns1123_subdomain_matches(s: &str) -> bool {
    s.split('.').all(dns1123_label_matches)
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`
fn dns1035_label_matches(s: &str) -> bool {
    dns1123_label_matches(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`: a label key's name part, a non-empty label value.
fn label_key_name_matches(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// pkg/util/validation's `IsDNS1123Label`: problems with `s` as an RFC 1123 label (empty when valid). A valid
/// subdomain that is not a label (it has dots) gets "must not contain dots" instead of the regex.
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX {
        errs.push(max_len_characters(DNS1123_LABEL_MAX));
    }
    if !dns1123_label_matches(s) {
        if dns1123_subdomain_matches(s) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

fn dns1123_subdomain_with(s: &str, max_len: fn(usize) -> String) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX {
        errs.push(max_len(DNS1123_SUBDOMAIN_MAX));
    }
    // The whole name at most 253 bytes and the regex; its dot-separated parts have no length limit of their own
    // (unlike DNS itself).
    if !dns1123_subdomain_matches(s) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// pkg/util/validation's `IsDNS1123Subdomain`: problems with `s` as an RFC 1123 subdomain (empty when valid).
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    dns1123_subdomain_with(s, max_len_characters)
}

/// pkg/util/validation's `IsDNS1035Label` (empty when valid).
pub fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > DNS1035_LABEL_MAX {
        errs.push(max_len_characters(DNS1035_LABEL_MAX));
    }
    if !dns1035_label_matches(s) {
        errs.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// content's `IsLabelKey` (pkg/util/validation's `IsQualifiedName`): problems with `s` as a qualified name
/// (`[prefix/]name`), used for label and annotation keys, finalizers and condition types.
pub fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                let problems = dns1123_subdomain_with(prefix, max_len_bytes);
                errs.extend(problems.into_iter().map(|e| format!("prefix part {e}")));
            }
            name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_ERR, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > LABEL_KEY_NAME_MAX {
        errs.push(format!("name part {}", max_len_bytes(LABEL_KEY_NAME_MAX)));
    }
    // An empty name part fails the regex too: Go reports both.
    if !label_key_name_matches(name) {
        errs.push(format!(
            "name part {}",
            regex_error(LABEL_KEY_ERR, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
        ));
    }
    errs
}

/// content's `IsLabelValue` (pkg/util/validation's `IsValidLabelValue`): empty, or a label key's name part.
pub fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > LABEL_VALUE_MAX {
        errs.push(max_len_bytes(LABEL_VALUE_MAX));
    }
    if !s.is_empty() && !label_key_name_matches(s) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// content's `IsPathSegmentName` and `IsPathSegmentPrefix`: what the generic registry requires of every name (it
/// becomes a URL path segment and a storage key), `.` and `..` only as whole names.
pub fn path_segment_name(s: &str, prefix: bool) -> Vec<String> {
    if !prefix {
        for whole in [".", ".."] {
            if s == whole {
                return vec![format!("may not be '{whole}'")];
            }
        }
    }
    ["/", "%"].iter().filter(|c| s.contains(**c)).map(|c| format!("may not contain '{c}'")).collect()
}

/// generic.go's `maskTrailingDash`, as Go writes it: a trailing dash of a name longer than one byte is replaced,
/// with the character before it, by one `a` (`name[:len(name)-2] + "a"`). So `ab-` is checked as `aa`, and a
/// prefix is checked one byte shorter than it is.
fn mask_trailing_dash(name: &str) -> std::borrow::Cow<'_, str> {
    let b = name.as_bytes();
    if b.len() > 1 && b[b.len() - 1] == b'-' {
        // Bytes, as Go slices. A multi-byte character cut into is invalid to every name rule, as are its bytes
        // left in Go's string; each stands in as a `_` (as invalid, and of the same length).
        let cut = &b[..b.len() - 2];
        let valid = std::str::from_utf8(cut).map_or_else(|e| e.valid_up_to(), |s| s.len());
        let mut masked = String::from_utf8_lossy(&cut[..valid]).into_owned();
        masked.extend(std::iter::repeat_n('_', cut.len() - valid));
        masked.push('a');
        return masked.into();
    }
    name.into()
}

/// Name validation of a kind (generic.go's `ValidateNameFunc`s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameRule {
    /// `NameIsDNSSubdomain`: most kinds, custom resources.
    Subdomain,
    /// `NameIsDNSLabel` (= `ValidateNamespaceName`): namespaces, Gardener's ShootState.
    Label,
    /// No name rule of the kind's own: its strategy does not call `ValidateObjectMeta` (core/v1 Event), so only
    /// the generic registry's check runs, `ValidateObjectMetaAccessor` with path-segment names, and only once the
    /// kind's own validation has passed (k8s.io/apiserver pkg/registry/rest/create.go, `BeforeCreate`).
    PathSegment,
}

impl NameRule {
    /// The rule's `ValidateNameFunc(name, prefix)`: `prefix` for a generateName, whose trailing dash is masked.
    pub fn check(self, name: &str, prefix: bool) -> Vec<String> {
        match self {
            NameRule::PathSegment => path_segment_name(name, prefix),
            NameRule::Subdomain | NameRule::Label => {
                let name = if prefix { mask_trailing_dash(name) } else { name.into() };
                match self {
                    NameRule::Label => dns1123_label(&name),
                    _ => dns1123_subdomain(&name),
                }
            }
        }
    }
}

/// apimachinery's `IsFullyQualifiedDomainName`, as a yes or no: at least two dot-separated DNS-1123 labels, at most
/// 253 characters, a trailing dot allowed.
pub fn is_fully_qualified_domain_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name);
    name.split('.').count() >= 2
        && dns1123_subdomain(name).is_empty()
        && name.split('.').all(|label| dns1123_label(label).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL_REGEX: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const SUBDOMAIN_REGEX: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const DNS1035_REGEX: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
    const NAME_PART_REGEX: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const LABEL_KEY_REGEX: &str = "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";
    const LABEL_VALUE_REGEX: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    fn a(n: usize) -> String {
        "a".repeat(n)
    }

    fn check(f: fn(&str) -> Vec<String>, what: &str, good: &[&str], bad: &[&str]) {
        for v in good {
            assert_eq!(f(v), Vec::<String>::new(), "{what}: {v:?} is valid");
        }
        for v in bad {
            assert!(!f(v).is_empty(), "{what}: {v:?} is invalid");
        }
    }

    /// apimachinery pkg/util/validation/validation_test.go `TestIsDNS1123Label` (and content/dns_test.go's).
    #[test]
    fn is_dns1123_label() {
        let good = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2"];
        let bad = [
            "", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b", "1_", "_1",
            "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b", "1 ", " 1", "1 2",
        ];
        check(dns1123_label, "IsDNS1123Label", &good, &bad);
        assert!(dns1123_label(&a(63)).is_empty());
        assert_eq!(dns1123_label(&a(64)), ["must be no more than 63 characters"]);
        // The messages: a valid subdomain with dots is told so; anything else gets the regex; the regex is checked
        // on the whole value, past 63 too.
        assert_eq!(dns1123_label("a.b"), ["must not contain dots"]);
        assert_eq!(dns1123_label("1.2"), ["must not contain dots"]);
        assert_eq!(dns1123_label("a."), [LABEL_REGEX]);
        assert_eq!(dns1123_label(""), [LABEL_REGEX]);
        assert_eq!(
            dns1123_label(&format!("{}.b", a(100))),
            ["must be no more than 63 characters", "must not contain dots"]
        );
        assert_eq!(dns1123_label(&format!("{}-", a(63))), ["must be no more than 63 characters", LABEL_REGEX]);
        // Bytes, as Go's len: 32 two-byte characters are 64.
        assert_eq!(dns1123_label(&"é".repeat(32)), ["must be no more than 63 characters", LABEL_REGEX]);
    }

    /// `TestIsDNS1123Subdomain`: a part may be longer than a label; only the total is bounded.
    #[test]
    fn is_dns1123_subdomain() {
        let good = [
            "a",
            "ab",
            "abc",
            "a1",
            "a-1",
            "a--1--2--b",
            "0",
            "01",
            "012",
            "1a",
            "1-a",
            "1--a--b--2",
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
            "1--a--b--2",
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
        ];
        let bad = [
            "",
            "A",
            "ABC",
            "aBc",
            "A1",
            "A-1",
            "1-A",
            "-",
            "a-",
            "-a",
            "1-",
            "-1",
            "_",
            "a_",
            "_a",
            "a_b",
            "1_",
            "_1",
            "1_2",
            ".",
            "a.",
            ".a",
            "a..b",
            "1.",
            ".1",
            "1..2",
            " ",
            "a ",
            " a",
            "a b",
            "1 ",
            " 1",
            "1 2",
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
            "a@b",
            "a,b",
            "a_b",
            "a;b",
            "a:b",
            "a%b",
            "a?b",
            "a$b",
        ];
        check(dns1123_subdomain, "IsDNS1123Subdomain", &good, &bad);
        assert!(dns1123_subdomain(&a(253)).is_empty());
        assert!(dns1123_subdomain(&format!("x{}", a(63))).is_empty());
        assert!(dns1123_subdomain(&format!("{}.b", a(100))).is_empty());
        assert_eq!(dns1123_subdomain(&a(254)), ["must be no more than 253 characters"]);
        assert_eq!(dns1123_subdomain("Bad_Name"), [SUBDOMAIN_REGEX]);
        assert_eq!(
            dns1123_subdomain(&format!("{}-", a(253))),
            ["must be no more than 253 characters", SUBDOMAIN_REGEX]
        );
    }

    /// `TestIsDNS1035Label`.
    #[test]
    fn is_dns1035_label() {
        let good = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b"];
        let bad = [
            "0",
            "01",
            "012",
            "1a",
            "1-a",
            "1--a--b--2",
            "",
            "A",
            "ABC",
            "aBc",
            "A1",
            "A-1",
            "1-A",
            "-",
            "a-",
            "-a",
            "1-",
            "-1",
            "_",
            "a_",
            "_a",
            "a_b",
            "1_",
            "_1",
            "1_2",
            ".",
            "a.",
            ".a",
            "a.b",
            "1.",
            ".1",
            "1.2",
            " ",
            "a ",
            " a",
            "a b",
            "1 ",
            " 1",
            "1 2",
        ];
        check(dns1035_label, "IsDNS1035Label", &good, &bad);
        assert!(dns1035_label(&a(63)).is_empty());
        assert_eq!(dns1035_label(&a(64)), ["must be no more than 63 characters"]);
        assert_eq!(dns1035_label("1a"), [DNS1035_REGEX]);
    }

    /// `TestIsQualifiedName` (content/kube_test.go `TestIsLabelKey`), with content's messages: lengths in bytes, a
    /// key of more than two parts one message, an empty name part both "non-empty" and the regex.
    #[test]
    fn is_qualified_name() {
        let good = [
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
            "Uppercase_Is_OK_123",
            "example.com/Uppercase_Is_OK_123",
            "requests.storage-foo",
        ];
        let bad = [
            "nospecialchars%^=@",
            "cantendwithadash-",
            "-cantstartwithadash-",
            "only/one/slash",
            "Example.com/abc",
            "example_com/abc",
            "example.com/",
            "/simple",
        ];
        check(qualified_name, "IsQualifiedName", &good, &bad);
        assert!(qualified_name(&a(63)).is_empty());
        assert!(qualified_name(&format!("{}/{}", a(253), "b".repeat(63))).is_empty());
        assert_eq!(qualified_name(&a(64)), ["name part must be no more than 63 bytes"]);
        assert_eq!(qualified_name(&format!("{}/abc", a(254))), ["prefix part must be no more than 253 bytes"]);
        assert_eq!(qualified_name("only/one/slash"), [LABEL_KEY_REGEX]);
        assert_eq!(qualified_name("example.com/"), ["name part must be non-empty", NAME_PART_REGEX]);
        assert_eq!(qualified_name("/simple"), ["prefix part must be non-empty"]);
        assert_eq!(qualified_name("Example.com/abc"), [format!("prefix part {SUBDOMAIN_REGEX}")]);
        assert_eq!(qualified_name("cantendwithadash-"), [NAME_PART_REGEX]);
        assert_eq!(qualified_name(""), ["name part must be non-empty", NAME_PART_REGEX]);
    }

    /// `TestIsValidLabelValue` (content/kube_test.go `TestIsLabelValue`).
    #[test]
    fn is_valid_label_value() {
        let good = ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", ""];
        let bad = [
            "nospecialchars%^=@",
            "Tama-nui-te-rā.is.Māori.sun",
            "\\backslashes\\are\\bad",
            "-starts-with-dash",
            "ends-with-dash-",
            ".starts.with.dot",
            "ends.with.dot.",
        ];
        check(label_value, "IsValidLabelValue", &good, &bad);
        assert!(label_value(&a(63)).is_empty());
        assert_eq!(label_value(&a(64)), ["must be no more than 63 bytes"]);
        assert_eq!(label_value("-starts-with-dash"), [LABEL_VALUE_REGEX]);
    }

    /// generic.go's `NameIsDNSSubdomain`/`NameIsDNSLabel` with `prefix`: `maskTrailingDash` replaces the dash and
    /// the character before it (objectmeta_test.go `TestValidateObjectMetaTrimsTrailingDash`: `foo-` is valid).
    #[test]
    fn generate_name_prefixes() {
        for rule in [NameRule::Subdomain, NameRule::Label] {
            assert!(rule.check("foo-", true).is_empty(), "{rule:?}");
            assert!(!rule.check("foo-", false).is_empty(), "{rule:?}");
            // The character before the dash is not checked...
            assert!(rule.check("A-", true).is_empty(), "{rule:?}");
            assert!(rule.check("ab_-", true).is_empty(), "{rule:?}");
            // ... and a lone dash is not masked.
            assert!(!rule.check("-", true).is_empty(), "{rule:?}");
            assert!(!rule.check("a--", false).is_empty(), "{rule:?}");
            assert!(rule.check("a--", true).is_empty(), "{rule:?}");
        }
        // The length is checked one short: 254 with a dash passes as a subdomain prefix, 64 as a label's.
        assert!(NameRule::Subdomain.check(&format!("{}-", a(253)), true).is_empty());
        assert_eq!(NameRule::Subdomain.check(&format!("{}-", a(254)), true), ["must be no more than 253 characters"]);
        assert!(NameRule::Label.check(&format!("{}-", a(63)), true).is_empty());
        assert_eq!(NameRule::Label.check(&format!("{}-", a(64)), true), ["must be no more than 63 characters"]);
        // A cut multi-byte character stays invalid, at Go's length.
        assert_eq!(NameRule::Label.check("aé-", true), [LABEL_REGEX]);
        // Path segments: '/' and '%' anywhere, '.' and '..' only as whole names.
        assert_eq!(NameRule::PathSegment.check("..", false), ["may not be '..'"]);
        assert!(NameRule::PathSegment.check("..", true).is_empty());
        assert_eq!(NameRule::PathSegment.check("a/b%", true), ["may not contain '/'", "may not contain '%'"]);
        assert!(NameRule::PathSegment.check("Any_Name", false).is_empty());
    }

    /// upstream's TestIsFullyQualifiedDomainName (pkg/util/validation), as yes or no.
    #[test]
    fn fully_qualified_domain_names() {
        for good in ["a.com", "k8s.io", "kms.example.com", "a.b.c.d", "a.com.", "1.2.3.4", "a-b.c-d"] {
            assert!(is_fully_qualified_domain_name(good), "{good}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        let long_name = format!("{}.com", vec!["a".repeat(63); 4].join("."));
        for bad in
            ["", ".", "a", "com.", "-a.com", "a-.com", "A.com", "a..com", "a_b.com", "a.com..", &long_label, &long_name]
        {
            assert!(!is_fully_qualified_domain_name(bad), "{bad}");
        }
    }
}
