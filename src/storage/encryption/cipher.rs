//! The ciphers of the aesgcm, aescbc and secretbox providers over kube-apiserver's stored layout (see the parent
//! module's documentation): one [`DataKey`] per named key of a provider.

use super::{Provider, ENCRYPTED_PREFIX};
use crate::storage::{Result, StorageError};
use aes_gcm::aead::rand_core::RngCore;
use aes_gcm::aead::{Aead, KeyInit, OsRng, Payload};
use aes_gcm::{Aes128Gcm, Aes256Gcm, AesGcm};
use cbc::cipher::block_padding::Pkcs7;
use cbc::cipher::{BlockDecryptMut, BlockEncryptMut, InnerIvInit};
use crypto_secretbox::XSalsa20Poly1305;

const GCM_NONCE: usize = 12;
const GCM_TAG: usize = 16;
const CBC_IV: usize = 16;
const SECRETBOX_NONCE: usize = 24;
const SECRETBOX_TAG: usize = 16;

type Aes192Gcm = AesGcm<aes::Aes192, aes_gcm::aead::consts::U12>;

enum Cipher {
    Gcm128(Box<Aes128Gcm>),
    Gcm192(Box<Aes192Gcm>),
    Gcm256(Box<Aes256Gcm>),
    Cbc128(aes::Aes128),
    Cbc192(aes::Aes192),
    Cbc256(aes::Aes256),
    Secretbox(Box<XSalsa20Poly1305>),
}

/// One named key of one provider, with the prefix its values carry.
pub(super) struct DataKey {
    pub(super) provider: Provider,
    pub(super) name: String,
    /// `k8s:enc:<provider>:v1:<name>:`
    pub(super) prefix: Vec<u8>,
    cipher: Cipher,
}

/// A key of a size its provider does not take.
#[derive(Debug, thiserror::Error)]
#[error("key must be {sizes} bytes, got {got} bytes")]
pub(super) struct KeySizeError {
    sizes: &'static str,
    got: usize,
}

impl DataKey {
    pub(super) fn new(provider: Provider, name: &str, secret: &[u8]) -> std::result::Result<Self, KeySizeError> {
        let sizes = match provider {
            Provider::AesGcm | Provider::AesCbc => "16, 24 or 32",
            Provider::Secretbox => "32",
        };
        let wrong_size = || KeySizeError { sizes, got: secret.len() };
        let cipher = match (provider, secret.len()) {
            (Provider::AesGcm, 16) => {
                Cipher::Gcm128(Box::new(Aes128Gcm::new_from_slice(secret).map_err(|_| wrong_size())?))
            }
            (Provider::AesGcm, 24) => {
                Cipher::Gcm192(Box::new(Aes192Gcm::new_from_slice(secret).map_err(|_| wrong_size())?))
            }
            (Provider::AesGcm, 32) => {
                Cipher::Gcm256(Box::new(Aes256Gcm::new_from_slice(secret).map_err(|_| wrong_size())?))
            }
            (Provider::AesCbc, 16) => Cipher::Cbc128(aes::Aes128::new_from_slice(secret).map_err(|_| wrong_size())?),
            (Provider::AesCbc, 24) => Cipher::Cbc192(aes::Aes192::new_from_slice(secret).map_err(|_| wrong_size())?),
            (Provider::AesCbc, 32) => Cipher::Cbc256(aes::Aes256::new_from_slice(secret).map_err(|_| wrong_size())?),
            (Provider::Secretbox, 32) => {
                Cipher::Secretbox(Box::new(XSalsa20Poly1305::new_from_slice(secret).map_err(|_| wrong_size())?))
            }
            _ => return Err(wrong_size()),
        };
        let prefix = format!("{ENCRYPTED_PREFIX}{}:v1:{name}:", provider.name()).into_bytes();
        Ok(Self { provider, name: name.to_owned(), prefix, cipher })
    }

    /// `aesgcm:v1:key1`
    pub(super) fn label(&self) -> String {
        format!("{}:v1:{}", self.provider.name(), self.name)
    }

    fn nonce_len(&self) -> usize {
        match self.provider {
            Provider::AesGcm => GCM_NONCE,
            Provider::AesCbc => CBC_IV,
            Provider::Secretbox => SECRETBOX_NONCE,
        }
    }

    /// The stored form of `plaintext` under `key`, with a fresh random nonce.
    pub(super) fn encrypt(&self, key: &str, plaintext: &[u8]) -> Result<Vec<u8>> {
        let mut nonce = vec![0u8; self.nonce_len()];
        OsRng
            .try_fill_bytes(&mut nonce)
            .map_err(|e| StorageError::Internal(format!("no randomness for an encryption nonce: {e}")))?;
        self.encrypt_with_nonce(key, plaintext, &nonce)
    }

    /// `prefix || nonce || ciphertext` (see the module documentation for each provider's layout).
    pub(super) fn encrypt_with_nonce(&self, key: &str, plaintext: &[u8], nonce: &[u8]) -> Result<Vec<u8>> {
        let failed = || StorageError::Internal(format!("encrypting {key} with {} failed", self.label()));
        let aad = Payload { msg: plaintext, aad: key.as_bytes() };
        let sealed = match &self.cipher {
            Cipher::Gcm128(c) => c.encrypt(nonce.into(), aad).map_err(|_| failed())?,
            Cipher::Gcm192(c) => c.encrypt(nonce.into(), aad).map_err(|_| failed())?,
            Cipher::Gcm256(c) => c.encrypt(nonce.into(), aad).map_err(|_| failed())?,
            Cipher::Cbc128(c) => {
                cbc_encryptor(c, nonce).map_err(|_| failed())?.encrypt_padded_vec_mut::<Pkcs7>(plaintext)
            }
            Cipher::Cbc192(c) => {
                cbc_encryptor(c, nonce).map_err(|_| failed())?.encrypt_padded_vec_mut::<Pkcs7>(plaintext)
            }
            Cipher::Cbc256(c) => {
                cbc_encryptor(c, nonce).map_err(|_| failed())?.encrypt_padded_vec_mut::<Pkcs7>(plaintext)
            }
            Cipher::Secretbox(c) => c.encrypt(nonce.into(), plaintext).map_err(|_| failed())?,
        };
        let mut out = Vec::with_capacity(self.prefix.len() + nonce.len() + sealed.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext of `data` (the stored value after the prefix) stored under `key`.
    pub(super) fn decrypt(&self, key: &str, data: &[u8]) -> Result<Vec<u8>> {
        let failed = |why: &str| {
            StorageError::Internal(format!(
                "cannot decrypt {key} with encryption key {:?} ({}): {why}",
                self.name,
                self.label()
            ))
        };
        let n = self.nonce_len();
        let min = match self.provider {
            Provider::AesGcm => n + GCM_TAG,
            Provider::AesCbc => n + CBC_IV,
            Provider::Secretbox => n + SECRETBOX_TAG,
        };
        if data.len() < min {
            return Err(failed("the stored value is too short"));
        }
        let (nonce, sealed) = data.split_at(n);
        let wrong = "wrong key or corrupt data";
        let payload = Payload { msg: sealed, aad: key.as_bytes() };
        match &self.cipher {
            Cipher::Gcm128(c) => c.decrypt(nonce.into(), payload).map_err(|_| failed(wrong)),
            Cipher::Gcm192(c) => c.decrypt(nonce.into(), payload).map_err(|_| failed(wrong)),
            Cipher::Gcm256(c) => c.decrypt(nonce.into(), payload).map_err(|_| failed(wrong)),
            Cipher::Cbc128(c) => cbc_decrypt(c, nonce, sealed).ok_or_else(|| failed(wrong)),
            Cipher::Cbc192(c) => cbc_decrypt(c, nonce, sealed).ok_or_else(|| failed(wrong)),
            Cipher::Cbc256(c) => cbc_decrypt(c, nonce, sealed).ok_or_else(|| failed(wrong)),
            Cipher::Secretbox(c) => c.decrypt(nonce.into(), sealed).map_err(|_| failed(wrong)),
        }
    }
}

fn cbc_encryptor<C>(cipher: &C, iv: &[u8]) -> std::result::Result<cbc::Encryptor<C>, cbc::cipher::InvalidLength>
where
    C: Clone + cbc::cipher::BlockEncryptMut + cbc::cipher::BlockCipher,
{
    cbc::Encryptor::inner_iv_slice_init(cipher.clone(), iv)
}

fn cbc_decrypt<C>(cipher: &C, iv: &[u8], sealed: &[u8]) -> Option<Vec<u8>>
where
    C: Clone + cbc::cipher::BlockDecryptMut + cbc::cipher::BlockCipher,
{
    if sealed.is_empty() || !sealed.len().is_multiple_of(CBC_IV) {
        return None;
    }
    let dec = cbc::Decryptor::inner_iv_slice_init(cipher.clone(), iv).ok()?;
    dec.decrypt_padded_vec_mut::<Pkcs7>(sealed).ok()
}
