//! The audit flags, with kube-apiserver's names and defaults (k8s.io/apiserver `pkg/server/options/audit.go`: the
//! log backend's batch defaults are a buffer of 10000 and batches of one, unthrottled; its mode is blocking), and
//! their validation there.

use super::backend::log::{Format, LogBackend, LogOptions};
use super::backend::{BatchConfig, Mode, Sink, TruncateConfig};
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
}

impl AuditArgs {
    /// Upstream's `AuditLogOptions.Validate`, for a log that is on.
    fn validate(&self) -> anyhow::Result<()> {
        let mut errs = Vec::new();
        if self.audit_log_mode == Mode::Batch {
            if self.audit_log_batch_buffer_size == 0 {
                errs.push("invalid audit batch log buffer size 0, must be a positive number".to_string());
            }
            if self.audit_log_batch_max_size == 0 {
                errs.push("invalid audit batch log max batch size 0, must be a positive number".to_string());
            }
            if self.audit_log_batch_throttle_enable {
                if self.audit_log_batch_throttle_qps <= 0.0 {
                    errs.push(format!(
                        "invalid audit batch log throttle QPS {}, must be a positive number",
                        self.audit_log_batch_throttle_qps
                    ));
                }
                if self.audit_log_batch_throttle_burst == 0 {
                    errs.push("invalid audit batch log throttle burst 0, must be a positive number".to_string());
                }
            }
        }
        if self.audit_log_truncate_max_event_size == 0 {
            errs.push("invalid audit truncate log max event size 0, must be a positive number".to_string());
        }
        if self.audit_log_truncate_max_batch_size < self.audit_log_truncate_max_event_size {
            errs.push(format!(
                "invalid audit truncate log max batch size {}, must be greater than max event size ({})",
                self.audit_log_truncate_max_batch_size, self.audit_log_truncate_max_event_size
            ));
        }
        match errs.is_empty() {
            true => Ok(()),
            false => Err(anyhow::anyhow!("{}", errs.join("; "))),
        }
    }

    /// The auditor these flags describe: the policy is read and validated and the log opened now, so that a bad
    /// policy or an unwritable log stops the start.
    pub fn build(&self, metrics: Arc<AuditMetrics>) -> anyhow::Result<Auditor> {
        let policy = self.audit_policy_file.as_deref().map(Policy::from_file).transpose()?;
        let Some(path) = &self.audit_log_path else {
            if policy.is_some() {
                tracing::info!("No audit log path (--audit-log-path): no events will be recorded");
            }
            return Ok(Auditor::new(policy.map(PolicyRuleEvaluator::new), None, metrics));
        };
        self.validate()?;
        let Some(policy) = policy else {
            tracing::info!("No audit policy file provided, no events will be recorded for log backend");
            return Ok(Auditor::disabled(metrics));
        };
        let log = LogBackend::open(&LogOptions {
            path: path.clone(),
            format: self.audit_log_format,
            max_size_mb: self.audit_log_maxsize,
            max_backups: self.audit_log_maxbackup,
            max_age_days: self.audit_log_maxage,
            compress: self.audit_log_compress,
        })
        .map_err(|e| anyhow::anyhow!("ensureLogFile: {e}: {}", path.display()))?;
        let batch = BatchConfig {
            buffer_size: self.audit_log_batch_buffer_size,
            max_batch_size: self.audit_log_batch_max_size,
            max_batch_wait: self.audit_log_batch_max_wait,
            throttle: self
                .audit_log_batch_throttle_enable
                .then_some((self.audit_log_batch_throttle_qps, self.audit_log_batch_throttle_burst)),
        };
        let truncate = self.audit_log_truncate_enabled.then_some(TruncateConfig {
            max_event_size: self.audit_log_truncate_max_event_size,
            max_batch_size: self.audit_log_truncate_max_batch_size,
        });
        let sink = Sink::new(Box::new(log), self.audit_log_mode, batch, truncate, metrics.clone());
        tracing::info!(path = %path.display(), mode = ?self.audit_log_mode, format = ?self.audit_log_format, "audit log backend");
        Ok(Auditor::new(Some(PolicyRuleEvaluator::new(policy)), Some(sink), metrics))
    }
}
