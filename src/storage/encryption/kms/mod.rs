//! The `kms` provider with apiVersion v2 (KEP-3299), as kube-apiserver implements it: the stored `EncryptedObject`
//! and the data encryption ([`envelope`]). `../shared/reference/kms-v2.md` holds the upstream behaviour with sources.

pub mod envelope;

/// The generated KMS v2 plugin API (proto/kmsv2/api.proto) and stored object (proto/kmsv2/encrypted_object.proto).
pub mod proto {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("v2");
}
