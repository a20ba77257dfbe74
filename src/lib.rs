//! migration-apiserver: an aggregated API server and admission webhook server for storage version migration.
pub mod auth;
pub mod server;
pub mod storage;
