//! The stored form of a value under a KMS v2 provider, as kube-apiserver writes and reads it
//! (k8s.io/apiserver `pkg/storage/value/encrypt/envelope/kmsv2/envelope.go`, `.../encrypt/aes/aes_extended_nonce.go`):
//! `k8s:enc:kms:v2:<name>:` followed by the protobuf `EncryptedObject`, its checks, the data encryption of both
//! DEK source types, and the key of the decrypted-seed cache.

use super::proto::{EncryptedDekSourceType, EncryptedObject};
use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm};
use prost::Message;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use zeroize::Zeroizing;

/// The longest key_id and encrypted DEK source upstream accepts.
const MAX_KEY_ID_BYTES: usize = 1024;
const MAX_DEK_SOURCE_BYTES: usize = 1024;
/// The most annotation bytes (keys and values) upstream accepts.
const MAX_ANNOTATION_BYTES: usize = 32 * 1024;
/// The seed of type 1, and the random `info` of each write from which its key is derived.
pub const SEED_BYTES: usize = 32;
const INFO_BYTES: usize = 32;
const NONCE_BYTES: usize = 12;
const TAG_BYTES: usize = 16;

/// A key_id that upstream refuses, with the `error` label of `..._invalid_key_id_from_status_total`.
#[derive(Debug, thiserror::Error)]
pub enum KeyIdError {
    #[error("keyID is empty")]
    Empty,
    #[error("keyID is {0} bytes, which exceeds the max size of {MAX_KEY_ID_BYTES}")]
    TooLong(usize),
}

impl KeyIdError {
    /// `empty` or `too_long`.
    pub fn code(&self) -> &'static str {
        match self {
            KeyIdError::Empty => "empty",
            KeyIdError::TooLong(_) => "too_long",
        }
    }
}

/// upstream's `ValidateKeyID`.
pub fn validate_key_id(key_id: &str) -> Result<(), KeyIdError> {
    match key_id.len() {
        0 => Err(KeyIdError::Empty),
        n if n > MAX_KEY_ID_BYTES => Err(KeyIdError::TooLong(n)),
        _ => Ok(()),
    }
}

/// `sha256:<hex>` of a key_id, as upstream logs and labels it (empty for an empty key_id).
pub fn key_id_hash(key_id: &str) -> String {
    match key_id.is_empty() {
        true => String::new(),
        false => format!("sha256:{:x}", Sha256::digest(key_id.as_bytes())),
    }
}

/// upstream's `ValidateEncryptedObject`, on decode and encode alike.
pub fn validate(o: &EncryptedObject) -> Result<(), String> {
    if EncryptedDekSourceType::try_from(o.encrypted_dek_source_type).is_err() {
        return Err(format!("unknown encryptedDEKSourceType: {}", o.encrypted_dek_source_type));
    }
    if o.encrypted_data.is_empty() {
        return Err("encrypted data is empty".into());
    }
    match o.encrypted_dek_source.len() {
        0 => return Err("failed to validate encrypted DEK source: encrypted DEK source is empty".into()),
        n if n > MAX_DEK_SOURCE_BYTES => {
            return Err(format!(
                "failed to validate encrypted DEK source: encrypted DEK source is {n} bytes, which exceeds the max \
                 size of {MAX_DEK_SOURCE_BYTES}"
            ))
        }
        _ => {}
    }
    validate_key_id(&o.key_id).map_err(|e| format!("failed to validate key id: {e}"))?;
    validate_annotations(&o.annotations).map_err(|e| format!("failed to validate annotations: {e}"))
}

/// Keys are fully qualified DNS names; keys and values together at most 32 KiB.
pub fn validate_annotations(annotations: &HashMap<String, Vec<u8>>) -> Result<(), String> {
    let mut total = 0;
    for (k, v) in annotations {
        if !crate::validation::is_fully_qualified_domain_name(k) {
            return Err(format!(
                "annotations: Invalid value: {k:?}: should be a domain with at least two segments separated by dots"
            ));
        }
        total += k.len() + v.len();
    }
    match total > MAX_ANNOTATION_BYTES {
        true => {
            Err(format!("total size of annotations is {total}, which exceeds the max size of {MAX_ANNOTATION_BYTES}"))
        }
        false => Ok(()),
    }
}

/// The `EncryptedObject` after the prefix, checked.
pub fn decode(data: &[u8]) -> Result<EncryptedObject, String> {
    let o = EncryptedObject::decode(data).map_err(|e| format!("failed to unmarshal encrypted object: {e}"))?;
    validate(&o).map_err(|e| format!("invalid encrypted object: {e}"))?;
    Ok(o)
}

/// The encoded `EncryptedObject`, checked first.
pub fn encode(o: &EncryptedObject) -> Result<Vec<u8>, String> {
    validate(o).map_err(|e| format!("invalid encrypted object: {e}"))?;
    Ok(o.encode_to_vec())
}

/// The key of the decrypted-seed cache (upstream's `generateCacheKey`, hashed): SHA-256 of the type (u32), the
/// encrypted DEK source and the key_id (u16-length-prefixed), then, when there are annotations, their count (u32) and
/// each key and value (u16-length-prefixed) in key order. Two values share a seed exactly when these are equal.
pub fn cache_key(
    source_type: i32,
    encrypted_dek_source: &[u8],
    key_id: &str,
    annotations: &HashMap<String, Vec<u8>>,
) -> [u8; 32] {
    let mut h = Sha256::new();
    let prefixed = |h: &mut Sha256, b: &[u8]| {
        h.update((b.len() as u16).to_be_bytes());
        h.update(b);
    };
    h.update((source_type as u32).to_be_bytes());
    prefixed(&mut h, encrypted_dek_source);
    prefixed(&mut h, key_id.as_bytes());
    if !annotations.is_empty() {
        h.update((annotations.len() as u32).to_be_bytes());
        let mut keys: Vec<&String> = annotations.keys().collect();
        keys.sort();
        for k in keys {
            prefixed(&mut h, k.as_bytes());
            prefixed(&mut h, &annotations[k]);
        }
    }
    h.finalize().into()
}

/// A decrypted DEK source: what reads (and, for the write seed, writes) use.
pub enum DataKeySource {
    /// Type 1: each value's AES-256-GCM key is HKDF-Expand(SHA-256, seed, info).
    Seed(Zeroizing<[u8; SEED_BYTES]>),
    /// Type 0: one AES-GCM key (16, 24 or 32 bytes) for every value.
    AesGcmKey(Zeroizing<Vec<u8>>),
}

type Aes192Gcm = AesGcm<aes::Aes192, aes_gcm::aead::consts::U12>;

impl DataKeySource {
    /// The plaintext of a DEK source as Decrypt returned it, for `source_type`.
    pub fn new(source_type: i32, plaintext: Vec<u8>) -> Result<Self, String> {
        let plaintext = Zeroizing::new(plaintext);
        match EncryptedDekSourceType::try_from(source_type) {
            Ok(EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed) => {
                let seed: [u8; SEED_BYTES] = plaintext
                    .as_slice()
                    .try_into()
                    .map_err(|_| format!("invalid seed length {}, expected {SEED_BYTES} bytes", plaintext.len()))?;
                Ok(DataKeySource::Seed(Zeroizing::new(seed)))
            }
            Ok(EncryptedDekSourceType::AesGcmKey) => match plaintext.len() {
                16 | 24 | 32 => Ok(DataKeySource::AesGcmKey(plaintext)),
                n => Err(format!("invalid AES key length {n}")),
            },
            Err(_) => Err(format!("unknown encryptedDEKSourceType: {source_type}")),
        }
    }

    /// A new random seed.
    pub fn random_seed() -> Result<Self, String> {
        let mut seed = Zeroizing::new([0u8; SEED_BYTES]);
        OsRng.try_fill_bytes(seed.as_mut()).map_err(|e| format!("no randomness for a seed: {e}"))?;
        Ok(DataKeySource::Seed(seed))
    }

    /// The seed's bytes (what Encrypt is given); empty for a type 0 key, which is never written.
    pub fn seed_bytes(&self) -> &[u8] {
        match self {
            DataKeySource::Seed(s) => s.as_slice(),
            DataKeySource::AesGcmKey(_) => &[],
        }
    }

    /// `encryptedData` of `plaintext` under the storage key `aad`: type 1 only (type 0 is never written).
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<Vec<u8>, String> {
        let DataKeySource::Seed(seed) = self else {
            return Err("the AES-GCM key DEK source type is read only".into());
        };
        let mut head = [0u8; INFO_BYTES + NONCE_BYTES];
        OsRng.try_fill_bytes(&mut head).map_err(|e| format!("no randomness for an encryption nonce: {e}"))?;
        let (info, nonce) = head.split_at(INFO_BYTES);
        let cipher = Aes256Gcm::new_from_slice(derive_key(seed.as_slice(), info)?.as_slice())
            .map_err(|_| "invalid derived key".to_string())?;
        let sealed = cipher
            .encrypt(nonce.into(), Payload { msg: plaintext, aad })
            .map_err(|_| "AES-GCM encryption failed".to_string())?;
        let mut out = Vec::with_capacity(head.len() + sealed.len());
        out.extend_from_slice(&head);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext of `encryptedData` stored under the storage key `aad`.
    pub fn open(&self, data: &[u8], aad: &[u8]) -> Result<Vec<u8>, String> {
        let payload_after = |skip: usize| -> Result<(&[u8], Payload<'_, '_>), String> {
            if data.len() < skip + NONCE_BYTES + TAG_BYTES {
                return Err("the encrypted data is too short".into());
            }
            let (nonce, sealed) = data[skip..].split_at(NONCE_BYTES);
            Ok((nonce, Payload { msg: sealed, aad }))
        };
        let wrong = |_| "failed to decrypt the data: wrong key or corrupt data".to_string();
        match self {
            DataKeySource::Seed(seed) => {
                let (nonce, payload) = payload_after(INFO_BYTES)?;
                let key = derive_key(seed.as_slice(), &data[..INFO_BYTES])?;
                let cipher =
                    Aes256Gcm::new_from_slice(key.as_slice()).map_err(|_| "invalid derived key".to_string())?;
                cipher.decrypt(nonce.into(), payload).map_err(wrong)
            }
            DataKeySource::AesGcmKey(key) => {
                let (nonce, payload) = payload_after(0)?;
                let invalid = |_| "invalid AES key".to_string();
                match key.len() {
                    16 => {
                        Aes128Gcm::new_from_slice(key).map_err(invalid)?.decrypt(nonce.into(), payload).map_err(wrong)
                    }
                    24 => {
                        Aes192Gcm::new_from_slice(key).map_err(invalid)?.decrypt(nonce.into(), payload).map_err(wrong)
                    }
                    _ => Aes256Gcm::new_from_slice(key).map_err(invalid)?.decrypt(nonce.into(), payload).map_err(wrong),
                }
            }
        }
    }
}

/// The first 32 bytes of HKDF-Expand(SHA-256, PRK = seed, info): there is no Extract step and no salt.
fn derive_key(seed: &[u8], info: &[u8]) -> Result<Zeroizing<[u8; 32]>, String> {
    let hk = hkdf::Hkdf::<Sha256>::from_prk(seed).map_err(|_| "the seed is too short for HKDF".to_string())?;
    let mut key = Zeroizing::new([0u8; 32]);
    hk.expand(info, key.as_mut()).map_err(|_| "HKDF expand failed".to_string())?;
    Ok(key)
}

#[cfg(test)]
#[path = "envelope_tests.rs"]
mod tests;
