//! Secrets at rest: each value sealed with XChaCha20-Poly1305 under a
//! 256-bit key only the hosts hold (`JOBHOST_SECRET_KEY`, or a key file),
//! bound to its name so a sealed value copied under another name does not
//! open. The database keeps the sealed bytes and the key's fingerprint,
//! never a value; a host with another key says which key each secret needs.

use std::fmt;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use sha2::{Digest, Sha256};

/// The environment variable holding the key, as 64 hex digits.
pub const KEY_VARIABLE: &str = "JOBHOST_SECRET_KEY";
/// The environment variable naming a file that holds the key.
pub const KEY_FILE_VARIABLE: &str = "JOBHOST_SECRET_KEY_FILE";
/// The largest secret value accepted.
pub const MAX_SECRET_BYTES: usize = 16 << 10;

/// The hosts' key.
#[derive(Clone)]
pub struct SecretKey([u8; 32]);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey({})", self.fingerprint())
    }
}

/// A value as stored: which key sealed it, the nonce, and the ciphertext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// The sealing key's fingerprint ([`SecretKey::fingerprint`]).
    pub key_id: String,
    /// A random 24-byte nonce, never reused under one key.
    pub nonce: Vec<u8>,
    /// The value, encrypted and authenticated with its name.
    pub ciphertext: Vec<u8>,
}

impl SecretKey {
    /// A new random key.
    ///
    /// # Errors
    /// The system has no randomness to give.
    pub fn generate() -> Result<Self, String> {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("no randomness for a key: {e}"))?;
        Ok(SecretKey(key))
    }

    /// The key written as 64 hex digits (surrounding white space ignored).
    ///
    /// # Errors
    /// Anything else, without echoing it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bytes = hex::decode(text.trim()).map_err(|_| "the secret key is not hex".to_string())?;
        let key: [u8; 32] =
            bytes.try_into().map_err(|_| "the secret key is not 64 hex digits (256 bits)".to_string())?;
        Ok(SecretKey(key))
    }

    /// The key this host holds: `JOBHOST_SECRET_KEY`, or the file
    /// `JOBHOST_SECRET_KEY_FILE` names; `None` when neither is set.
    ///
    /// # Errors
    /// A key that is set but unreadable or malformed.
    pub fn from_environment() -> Result<Option<Self>, String> {
        if let Ok(text) = std::env::var(KEY_VARIABLE) {
            return Self::parse(&text).map(Some).map_err(|e| format!("{KEY_VARIABLE}: {e}"));
        }
        let Some(path) = std::env::var_os(KEY_FILE_VARIABLE) else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{KEY_FILE_VARIABLE} ({}): {e}", std::path::Path::new(&path).display()))?;
        Self::parse(&text).map(Some).map_err(|e| format!("{KEY_FILE_VARIABLE}: {e}"))
    }

    /// The key as 64 hex digits, to store somewhere safe.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 16 hex digits of the key's SHA-256: names the key in the
    /// database and in errors without revealing it.
    pub fn fingerprint(&self) -> String {
        hex::encode(&Sha256::digest(self.0)[..8])
    }

    /// Seals `value` as the secret `name`.
    ///
    /// # Errors
    /// No randomness for the nonce.
    pub fn seal(&self, name: &str, value: &str) -> Result<Sealed, String> {
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce).map_err(|e| format!("no randomness for a nonce: {e}"))?;
        let cipher = XChaCha20Poly1305::new((&self.0).into());
        let ciphertext = cipher
            .encrypt(XNonce::from_slice(&nonce), Payload { msg: value.as_bytes(), aad: name.as_bytes() })
            .map_err(|_| "the secret could not be sealed".to_string())?;
        Ok(Sealed { key_id: self.fingerprint(), nonce: nonce.to_vec(), ciphertext })
    }

    /// Opens the secret `name`.
    ///
    /// # Errors
    /// Sealed under another key, or altered, or moved from another name.
    pub fn open(&self, name: &str, sealed: &Sealed) -> Result<String, String> {
        if sealed.key_id != self.fingerprint() {
            return Err(format!(
                "secret {name} was sealed with key {}, this host has key {}",
                sealed.key_id,
                self.fingerprint()
            ));
        }
        if sealed.nonce.len() != 24 {
            return Err(format!("secret {name} is damaged (its nonce)"));
        }
        let cipher = XChaCha20Poly1305::new((&self.0).into());
        let plain = cipher
            .decrypt(XNonce::from_slice(&sealed.nonce), Payload { msg: &sealed.ciphertext, aad: name.as_bytes() })
            .map_err(|_| format!("secret {name} does not open with this host's key: altered or moved"))?;
        String::from_utf8(plain).map_err(|_| format!("secret {name} is not text"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_under_its_key_and_name() {
        let key = SecretKey::generate().unwrap();
        let sealed = key.seal("MAILGUN_KEY", "key-3ax6xnjp29jd6fds4gc373sgvjxteol0").unwrap();
        assert!(!sealed.ciphertext.windows(8).any(|w| w == b"key-3ax6"), "not in clear");
        assert_eq!(key.open("MAILGUN_KEY", &sealed).unwrap(), "key-3ax6xnjp29jd6fds4gc373sgvjxteol0");
        let moved = key.open("OTHER", &sealed).unwrap_err();
        assert!(moved.contains("altered or moved"), "{moved}");
        let other = SecretKey::generate().unwrap();
        let wrong = other.open("MAILGUN_KEY", &sealed).unwrap_err();
        assert!(wrong.contains(&format!("sealed with key {}", key.fingerprint())), "{wrong}");
        let mut altered = sealed.clone();
        altered.ciphertext[0] ^= 1;
        assert!(key.open("MAILGUN_KEY", &altered).is_err());
        let again = key.seal("MAILGUN_KEY", "key-3ax6xnjp29jd6fds4gc373sgvjxteol0").unwrap();
        assert_ne!(again.nonce, sealed.nonce, "a fresh nonce each time");
    }

    #[test]
    fn a_key_is_64_hex_digits_and_never_echoed() {
        let key = SecretKey::generate().unwrap();
        assert_eq!(SecretKey::parse(&format!(" {}\n", key.to_hex())).unwrap().fingerprint(), key.fingerprint());
        for bad in ["", "abc", "zz", &"ab".repeat(31)] {
            let error = SecretKey::parse(bad).unwrap_err();
            assert!(!bad.is_empty() && !error.contains(bad) || bad.is_empty(), "{error}");
        }
        assert!(!format!("{key:?}").contains(&key.to_hex()));
    }
}
