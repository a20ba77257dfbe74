//! Auditing as kube-apiserver audits (k8s.io/apiserver `pkg/audit`, `plugin/pkg/audit`): a policy says how much of
//! each request to record ([`policy`]).

#[cfg(test)]
pub(crate) mod checker_cases;
pub mod policy;
