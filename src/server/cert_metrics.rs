//! `migration_apiserver_serving_certificate_expiration_timestamp_seconds`: when the serving certificate in use
//! expires, read from the certificate served at scrape time (so a reloaded certificate counts at once).
//!
//! This project's own: kube-apiserver exports no expiry of its own serving certificate
//! (`apiserver_client_certificate_expiration_seconds` is a histogram of the client certificates presented to it,
//! and kubelet's `kubelet_certificate_manager_server_ttl_seconds` belongs to its certificate manager).

use crate::auth::tls::ReloadableCertResolver;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::Arc;

pub const NAME: &str = "migration_apiserver_serving_certificate_expiration_timestamp_seconds";
const HELP: &str = "Unix time at which the serving certificate in use expires (its notAfter).";

/// Reads the expiry of the served certificate at every scrape.
#[derive(Debug)]
pub struct ServingCertExpiry(pub Arc<ReloadableCertResolver>);

impl Collector for ServingCertExpiry {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let key = self.0.current();
        let Some(leaf) = key.cert.first() else { return Ok(()) };
        let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf) else { return Ok(()) };
        let gauge = ConstGauge::new(cert.validity().not_after.timestamp() as f64);
        // `Registry::register` appends a period to every HELP text and the exposition takes it off again; a
        // collector's descriptor is passed as is, so it carries that period itself.
        let metric = encoder.encode_descriptor(NAME, &format!("{HELP}."), None, gauge.metric_type())?;
        gauge.encode(metric)
    }
}
