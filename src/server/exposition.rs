//! The Prometheus text exposition format 0.0.4, written as client_golang writes it (prometheus/common
//! `expfmt/text_create.go`, `MetricFamilyToText`), over prometheus-client's registry.
//!
//! kube-apiserver and kube-storage-version-migrator serve this format whatever the scrape's Accept header says
//! (neither offers OpenMetrics), and in it a counter's samples carry the family's own name: kube-apiserver
//! registers `apiserver_request_total` with its `_total`, the migrator registers
//! `storage_migrator_core_migrator_migrated_objects` without one. prometheus-client writes only OpenMetrics, where
//! every counter sample gets `_total` appended, so this module writes the text format itself.
//!
//! The families come from prometheus-client's own data model (`prometheus_protobuf::encode`, no bytes are
//! serialised). That model names a counter family `<registered name>_total` and every HELP text gets a final `.`
//! ([`Registry::register`]); both are undone here, so what is exposed is exactly the name and HELP registered. Every
//! family is therefore registered under its full upstream name and upstream HELP, never with a unit.
//!
//! As client_golang: families without series left out, families sorted by name, series sorted by their label values, label pairs sorted by name
//! (`le` last), values formatted as Go's `strconv.FormatFloat(v, 'g', -1, 64)`, the `+Inf` bucket always written.

use prometheus_client::encoding::prometheus_protobuf::{self, prometheus_data_model as model};
use prometheus_client::registry::Registry;
use std::fmt::Write;

/// The Content-Type of the text format 0.0.4, as client_golang's `expfmt.FmtText`.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Debug, thiserror::Error)]
#[error("encoding the metrics failed")]
pub struct ExpositionError;

/// The registry's families in the text format 0.0.4.
pub fn encode(registry: &Registry) -> Result<String, ExpositionError> {
    let mut families = prometheus_protobuf::encode(registry).map_err(|_| ExpositionError)?;
    for family in &mut families {
        if family.r#type == model::MetricType::Counter as i32 {
            if let Some(name) = family.name.strip_suffix("_total") {
                family.name = name.to_string();
            }
        }
        if let Some(help) = family.help.strip_suffix('.') {
            family.help = help.to_string();
        }
    }
    // As client_golang's `NormalizeMetricFamilies`: a family without series (a vector nothing was counted in yet)
    // is not written at all.
    families.retain(|f| !f.metric.is_empty());
    families.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for family in &mut families {
        write_family(&mut out, family).map_err(|_| ExpositionError)?;
    }
    Ok(out)
}

fn write_family(out: &mut String, family: &mut model::MetricFamily) -> std::fmt::Result {
    let kind = match model::MetricType::try_from(family.r#type) {
        Ok(model::MetricType::Counter) => "counter",
        Ok(model::MetricType::Gauge) => "gauge",
        Ok(model::MetricType::Histogram) => "histogram",
        Ok(model::MetricType::Summary) => "summary",
        _ => "untyped",
    };
    for metric in &mut family.metric {
        metric.label.sort_by(|a, b| a.name.cmp(&b.name));
    }
    family.metric.sort_by(|a, b| {
        let values = |m: &model::Metric| m.label.iter().map(|l| l.value.clone()).collect::<Vec<_>>();
        values(a).cmp(&values(b))
    });
    let name = &family.name;
    writeln!(out, "# HELP {name} {}", escape_help(&family.help))?;
    writeln!(out, "# TYPE {name} {kind}")?;
    for metric in &family.metric {
        let labels = &metric.label;
        if let Some(c) = &metric.counter {
            sample(out, name, "", labels, None, c.value)?;
        } else if let Some(g) = &metric.gauge {
            sample(out, name, "", labels, None, g.value)?;
        } else if let Some(h) = &metric.histogram {
            let mut inf_seen = false;
            for b in &h.bucket {
                // prometheus-client's last bucket is +Inf, which its data model holds as f64::MAX.
                let bound = if b.upper_bound == f64::MAX { f64::INFINITY } else { b.upper_bound };
                inf_seen |= bound == f64::INFINITY;
                sample(out, name, "_bucket", labels, Some(bound), b.cumulative_count as f64)?;
            }
            if !inf_seen {
                sample(out, name, "_bucket", labels, Some(f64::INFINITY), h.sample_count as f64)?;
            }
            sample(out, name, "_sum", labels, None, h.sample_sum)?;
            sample(out, name, "_count", labels, None, h.sample_count as f64)?;
        }
    }
    Ok(())
}

/// One sample line: `name_suffix{labels,le="bound"} value`.
fn sample(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[model::LabelPair],
    le: Option<f64>,
    value: f64,
) -> std::fmt::Result {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || le.is_some() {
        out.push('{');
        let mut first = true;
        for l in labels {
            if !first {
                out.push(',');
            }
            first = false;
            write!(out, "{}=\"{}\"", l.name, escape_label_value(&l.value))?;
        }
        if let Some(bound) = le {
            if !first {
                out.push(',');
            }
            write!(out, "le=\"{}\"", go_float(bound))?;
        }
        out.push('}');
    }
    writeln!(out, " {}", go_float(value))
}

/// HELP escaping of the text format: backslash and newline.
fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Label value escaping of the text format: backslash, double quote and newline.
fn escape_label_value(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` with expfmt's spellings of the infinities and NaN: the shortest
/// digits that read back as `v`, in exponent form when the decimal exponent is below -4 or at least 6
/// (`1e+06`, `1.764e+09`, `5e-05`), plainly otherwise (`0.005`, `123456`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: `1.234567e6`, `5e-3`, `0e0`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if v != 0.0 && !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    } else {
        // Rust's Display of an f64 is the shortest round-trip decimal, never in exponent form.
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::EncodeLabelSet;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;

    #[test]
    fn floats_as_go_formats_them() {
        for (v, go) in [
            (0.0, "0"),
            (1.0, "1"),
            (-1.0, "-1"),
            (0.005, "0.005"),
            (1.25, "1.25"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (1.764172554e9, "1.764172554e+09"),
            (0.0001, "0.0001"),
            (0.00005, "5e-05"),
            (1e-300, "1e-300"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float(v), go, "{v}");
        }
    }

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        zeta: String,
        alpha: String,
    }

    #[test]
    fn counters_keep_their_registered_names_and_help() {
        let mut registry = Registry::default();
        let plain = Family::<Labels, Counter>::default();
        let with_total = Counter::<u64>::default();
        let gauge = Gauge::<i64>::default();
        let histogram = Histogram::new([0.5, 1.0]);
        registry.register("b_migrated_objects", "Objects, with a \\ and a\nnewline.", plain.clone());
        registry.register("a_requests_total", "Requests", with_total.clone());
        registry.register("c_gauge", "A gauge", gauge.clone());
        registry.register("d_seconds", "A histogram", histogram.clone());
        registry.register("e_empty", "Nothing counted yet", Family::<Labels, Counter>::default());
        plain.get_or_create(&Labels { zeta: "z".into(), alpha: "b\"q\"".into() }).inc_by(2);
        plain.get_or_create(&Labels { zeta: "y".into(), alpha: "a\\b\nc".into() }).inc();
        with_total.inc_by(1_000_000);
        gauge.set(-3);
        histogram.observe(0.7);
        histogram.observe(7.0);
        let text = encode(&registry).expect("encode");
        let want = "\
# HELP a_requests_total Requests
# TYPE a_requests_total counter
a_requests_total 1e+06
# HELP b_migrated_objects Objects, with a \\\\ and a\\nnewline.
# TYPE b_migrated_objects counter
b_migrated_objects{alpha=\"a\\\\b\\nc\",zeta=\"y\"} 1
b_migrated_objects{alpha=\"b\\\"q\\\"\",zeta=\"z\"} 2
# HELP c_gauge A gauge
# TYPE c_gauge gauge
c_gauge -3
# HELP d_seconds A histogram
# TYPE d_seconds histogram
d_seconds_bucket{le=\"0.5\"} 0
d_seconds_bucket{le=\"1\"} 1
d_seconds_bucket{le=\"+Inf\"} 2
d_seconds_sum 7.7
d_seconds_count 2
";
        assert_eq!(text, want);
    }
}
