//! migration-apiserver: an aggregated API server and admission webhook server for storage version migration.
pub mod api;
pub mod audit;
pub mod auth;
pub mod byte_size;
pub mod cli;
pub mod client;
pub mod csi;
pub mod duration;
pub mod error;
pub mod go_decode;
pub mod gostr;
pub mod kms_test_plugin;
pub mod registry;
pub mod request_info;
pub mod scheduler;
pub mod server;
pub mod storage;
