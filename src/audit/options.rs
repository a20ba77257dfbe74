//! The audit flags, with kube-apiserver's names and defaults (k8s.io/apiserver `pkg/server/options/audit.go`: the
//! log backend's batch defaults are a buffer of 10000 and batches of one, unthrottled, and its mode is blocking; the
//! webhook's are a buffer of 10000, batches of up to 400 or 30 s, throttled to 10 a second (burst 15), in batch
//! mode), and their validation there. Both backends can be on at once: each gets every event, as upstream's union.

use super::backend::log::{Format, LogBackend, LogOptions};
use super::backend::webhook::{WebhookBackend, WebhookOptions};
use super::backend::{Backend, BatchConfig, Mode, Sink, TruncateConfig};
use super::metrics::AuditMetrics;
use super::policy::{Policy, PolicyRuleEvaluator};
use super::Auditor;
use crate::duration::parse_duration;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug, Clone)]
pub struct AuditArgs {
    /// Path to the file that defines the audit policy configuration (audit.k8s.io/v1 Policy, YAML or JSON).
    /// Without it nothing is audited.
    #[arg(long)]
    pub audit_policy_file: Option<PathBuf>,
    /// If set, all requests coming to the apiserver will be logged to this file.  '-' means standard out.
    #[arg(long)]
    pub audit_log_path: Option<PathBuf>,
    /// Format of saved audits. "legacy" indicates 1-line text format for each event. "json" indicates structured
    /// json format. Known formats are legacy,json.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub audit_log_format: Format,
    /// The maximum size in megabytes of the audit log file before it gets rotated. Setting to 0 disables rotation
    /// (not recommended).
    #[arg(long, default_value_t = 100)]
    pub audit_log_maxsize: u64,
    /// The maximum number of old audit log files to retain. Setting a value of 0 will mean there's no restriction
    /// on the number of files.
    #[arg(long, default_value_t = 100)]
    pub audit_log_maxbackup: usize,
    /// The maximum number of days to retain old audit log files based on the timestamp encoded in their filename.
    /// Setting a value of 0 means old audit log files are not removed based on age.
    #[arg(long, default_value_t = 366)]
    pub audit_log_maxage: u64,
    /// If set, the rotated log files will be compressed using gzip.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_log_compress: bool,
    /// API group and version used for serializing audit events written to log.
    #[arg(long, default_value = "audit.k8s.io/v1", value_parser = ["audit.k8s.io/v1"])]
    pub audit_log_version: String,
    /// Strategy for sending audit events. Blocking indicates sending events should block server responses. Batch
    /// causes the backend to buffer and write events asynchronously. Known modes are batch,blocking,blocking-strict.
    #[arg(long, value_enum, default_value_t = Mode::Blocking)]
    pub audit_log_mode: Mode,
    /// The size of the buffer to store events before batching and writing. Only used in batch mode.
    #[arg(long, default_value_t = 10000)]
    pub audit_log_batch_buffer_size: usize,
    /// The maximum size of a batch. Only used in batch mode.
    #[arg(long, default_value_t = 1)]
    pub audit_log_batch_max_size: usize,
    /// The amount of time to wait before force writing the batch that hadn't reached the max size. Only used in
    /// batch mode.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub audit_log_batch_max_wait: Duration,
    /// Whether batching throttling is enabled. Only used in batch mode.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_log_batch_throttle_enable: bool,
    /// Maximum average number of batches per second. Only used in batch mode.
    #[arg(long, default_value_t = 0.0)]
    pub audit_log_batch_throttle_qps: f32,
    /// Maximum number of requests sent at the same moment if ThrottleQPS was not utilized before. Only used in
    /// batch mode.
    #[arg(long, default_value_t = 0)]
    pub audit_log_batch_throttle_burst: usize,
    /// Whether event and batch truncating is enabled.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_log_truncate_enabled: bool,
    /// Maximum size of the batch sent to the underlying backend. Actual serialized size can be several hundreds of
    /// bytes greater. If a batch exceeds this limit, it is split into several batches of smaller size.
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub audit_log_truncate_max_batch_size: usize,
    /// Maximum size of the audit event sent to the underlying backend. If the size of an event is greater than this
    /// number, first request and response are removed, and if this doesn't reduce the size enough, event is
    /// discarded.
    #[arg(long, default_value_t = 100 * 1024)]
    pub audit_log_truncate_max_event_size: usize,
    /// Path to a kubeconfig formatted file that defines the audit webhook configuration.
    #[arg(long)]
    pub audit_webhook_config_file: Option<PathBuf>,
    /// The amount of time to wait before retrying the first failed request.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub audit_webhook_initial_backoff: Duration,
    /// Strategy for sending audit events. Blocking indicates sending events should block server responses. Batch
    /// causes the backend to buffer and write events asynchronously. Known modes are batch,blocking,blocking-strict.
    #[arg(long, value_enum, default_value_t = Mode::Batch)]
    pub audit_webhook_mode: Mode,
    /// The size of the buffer to store events before batching and writing. Only used in batch mode.
    #[arg(long, default_value_t = 10000)]
    pub audit_webhook_batch_buffer_size: usize,
    /// The maximum size of a batch. Only used in batch mode.
    #[arg(long, default_value_t = 400)]
    pub audit_webhook_batch_max_size: usize,
    /// The amount of time to wait before force writing the batch that hadn't reached the max size. Only used in
    /// batch mode.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub audit_webhook_batch_max_wait: Duration,
    /// Whether batching throttling is enabled. Only used in batch mode.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_webhook_batch_throttle_enable: bool,
    /// Maximum average number of batches per second. Only used in batch mode.
    #[arg(long, default_value_t = 10.0)]
    pub audit_webhook_batch_throttle_qps: f32,
    /// Maximum number of requests sent at the same moment if ThrottleQPS was not utilized before. Only used in
    /// batch mode.
    #[arg(long, default_value_t = 15)]
    pub audit_webhook_batch_throttle_burst: usize,
    /// Whether event and batch truncating is enabled.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub audit_webhook_truncate_enabled: bool,
    /// Maximum size of the batch sent to the underlying backend. Actual serialized size can be several hundreds of
    /// bytes greater. If a batch exceeds this limit, it is split into several batches of smaller size.
    #[arg(long, default_value_t = 10 * 1024 * 1024)]
    pub audit_webhook_truncate_max_batch_size: usize,
    /// Maximum size of the audit event sent to the underlying backend. If the size of an event is greater than this
    /// number, first request and response are removed, and if this doesn't reduce the size enough, event is
    /// discarded.
    #[arg(long, default_value_t = 100 * 1024)]
    pub audit_webhook_truncate_max_event_size: usize,
    /// API group and version used for serializing audit events written to webhook.
    #[arg(long, default_value = "audit.k8s.io/v1", value_parser = ["audit.k8s.io/v1"])]
    pub audit_webhook_version: String,
}

/// One backend's mode, batching and truncation flags.
struct PluginFlags {
    name: &'static str,
    mode: Mode,
    batch: BatchConfig,
    throttle_enable: bool,
    qps: f32,
    burst: usize,
    truncate_enabled: bool,
    truncate: TruncateConfig,
}

impl PluginFlags {
    /// Upstream's `validateBackendBatchOptions` and `AuditTruncateOptions.Validate`, for a backend that is on.
    fn validate(&self, errs: &mut Vec<String>) {
        let name = self.name;
        if self.mode == Mode::Batch {
            if self.batch.buffer_size == 0 {
                errs.push(format!("invalid audit batch {name} buffer size 0, must be a positive number"));
            }
            if self.batch.max_batch_size == 0 {
                errs.push(format!("invalid audit batch {name} max batch size 0, must be a positive number"));
            }
            if self.throttle_enable {
                if self.qps <= 0.0 {
                    errs.push(format!(
                        "invalid audit batch {name} throttle QPS {}, must be a positive number",
                        self.qps
                    ));
                }
                if self.burst == 0 {
                    errs.push(format!("invalid audit batch {name} throttle burst 0, must be a positive number"));
                }
            }
        }
        if self.truncate.max_event_size == 0 {
            errs.push(format!("invalid audit truncate {name} max event size 0, must be a positive number"));
        }
        if self.truncate.max_batch_size < self.truncate.max_event_size {
            errs.push(format!(
                "invalid audit truncate {name} max batch size {}, must be greater than max event size ({})",
                self.truncate.max_batch_size, self.truncate.max_event_size
            ));
        }
    }

    fn sink(self, backend: Box<dyn Backend>, metrics: &Arc<AuditMetrics>) -> Sink {
        let mut batch = self.batch;
        batch.throttle = self.throttle_enable.then_some((self.qps, self.burst));
        let truncate = self.truncate_enabled.then_some(self.truncate);
        Sink::new(backend, self.mode, batch, truncate, metrics.clone())
    }
}

impl AuditArgs {
    fn log_flags(&self) -> PluginFlags {
        PluginFlags {
            name: "log",
            mode: self.audit_log_mode,
            batch: BatchConfig {
                buffer_size: self.audit_log_batch_buffer_size,
                max_batch_size: self.audit_log_batch_max_size,
                max_batch_wait: self.audit_log_batch_max_wait,
                throttle: None,
            },
            throttle_enable: self.audit_log_batch_throttle_enable,
            qps: self.audit_log_batch_throttle_qps,
            burst: self.audit_log_batch_throttle_burst,
            truncate_enabled: self.audit_log_truncate_enabled,
            truncate: TruncateConfig {
                max_event_size: self.audit_log_truncate_max_event_size,
                max_batch_size: self.audit_log_truncate_max_batch_size,
            },
        }
    }

    fn webhook_flags(&self) -> PluginFlags {
        PluginFlags {
            name: "webhook",
            mode: self.audit_webhook_mode,
            batch: BatchConfig {
                buffer_size: self.audit_webhook_batch_buffer_size,
                max_batch_size: self.audit_webhook_batch_max_size,
                max_batch_wait: self.audit_webhook_batch_max_wait,
                throttle: None,
            },
            throttle_enable: self.audit_webhook_batch_throttle_enable,
            qps: self.audit_webhook_batch_throttle_qps,
            burst: self.audit_webhook_batch_throttle_burst,
            truncate_enabled: self.audit_webhook_truncate_enabled,
            truncate: TruncateConfig {
                max_event_size: self.audit_webhook_truncate_max_event_size,
                max_batch_size: self.audit_webhook_truncate_max_batch_size,
            },
        }
    }

    /// Upstream's `AuditOptions.Validate`: each backend that is on.
    fn validate(&self) -> anyhow::Result<()> {
        let mut errs = Vec::new();
        if self.audit_log_path.is_some() {
            self.log_flags().validate(&mut errs);
        }
        if self.audit_webhook_config_file.is_some() {
            self.webhook_flags().validate(&mut errs);
        }
        match errs.is_empty() {
            true => Ok(()),
            false => Err(anyhow::anyhow!("{}", errs.join("; "))),
        }
    }

    /// The auditor these flags describe: the policy is read and validated, the log opened and the webhook's
    /// kubeconfig loaded now, so that a bad policy, an unwritable log or an unusable kubeconfig stops the start.
    pub fn build(&self, metrics: Arc<AuditMetrics>) -> anyhow::Result<Auditor> {
        let policy = self.audit_policy_file.as_deref().map(Policy::from_file).transpose()?;
        self.validate()?;
        let Some(policy) = policy else {
            for (on, name) in
                [(self.audit_log_path.is_some(), "log"), (self.audit_webhook_config_file.is_some(), "webhook")]
            {
                if on {
                    tracing::info!("No audit policy file provided, no events will be recorded for {name} backend");
                }
            }
            return Ok(Auditor::disabled(metrics));
        };
        let mut sinks = Vec::new();
        if let Some(path) = &self.audit_log_path {
            let log = LogBackend::open(&LogOptions {
                path: path.clone(),
                format: self.audit_log_format,
                max_size_mb: self.audit_log_maxsize,
                max_backups: self.audit_log_maxbackup,
                max_age_days: self.audit_log_maxage,
                compress: self.audit_log_compress,
            })
            .map_err(|e| anyhow::anyhow!("ensureLogFile: {e}: {}", path.display()))?;
            sinks.push(self.log_flags().sink(Box::new(log), &metrics));
            tracing::info!(path = %path.display(), mode = ?self.audit_log_mode, format = ?self.audit_log_format, "audit log backend");
        }
        if let Some(file) = &self.audit_webhook_config_file {
            let webhook = WebhookBackend::load(&WebhookOptions {
                config_file: file.clone(),
                initial_backoff: self.audit_webhook_initial_backoff,
            })?;
            sinks.push(self.webhook_flags().sink(Box::new(webhook), &metrics));
            tracing::info!(config = %file.display(), mode = ?self.audit_webhook_mode, "audit webhook backend");
        }
        if sinks.is_empty() {
            tracing::info!(
                "No audit backend (--audit-log-path, --audit-webhook-config-file): no events will be recorded"
            );
        }
        Ok(Auditor::new(Some(PolicyRuleEvaluator::new(policy)), sinks, metrics))
    }
}
