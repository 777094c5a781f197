//! A credential as the gateway holds it: shared by the broker (which mints
//! it), the pipeline (which redacts it from every output) and the sandboxes
//! (which get it as a file). A leaf module, so that none of them depends on
//! another for it.

use zeroize::Zeroizing;

/// A secret that is written into the sandbox as a read-only file and
/// nowhere else. Prints as `<redacted>`; zeroed when dropped.
#[derive(Clone)]
pub struct SecretFile(Zeroizing<Vec<u8>>);

impl SecretFile {
    pub fn new(bytes: Vec<u8>) -> SecretFile {
        SecretFile(Zeroizing::new(bytes))
    }
    pub fn from_zeroizing(bytes: Zeroizing<Vec<u8>>) -> SecretFile {
        SecretFile(bytes)
    }
    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::fmt::Display for SecretFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}
