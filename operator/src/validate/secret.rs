//! What the dereference step found for the cloud-config Secret: validation's input.

use std::fmt;

/// What the dereference step found for the cloud-config Secret.
#[derive(Clone)]
pub enum SecretState {
    /// The spec references no Secret.
    NotReferenced,
    /// The Secret does not exist.
    NotFound {
        /// Secret name.
        name: String,
    },
    /// The Secret exists but lacks the key.
    KeyNotFound {
        /// Secret name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// The cloud-config was read.
    Found {
        /// Secret name.
        name: String,
        /// The key.
        key: String,
        /// The value; never logged or copied into messages.
        data: Vec<u8>,
        /// The keys mounted beside it (`credentialsKey`, `caBundleKey`) and their values, in
        /// that order; never logged either.
        extra: Vec<(String, Vec<u8>)>,
    },
    /// Reading the Secret failed with an API error (transient).
    Unreadable {
        /// Secret name.
        name: String,
        /// The API error, which never carries the Secret's content.
        error: String,
    },
}

impl fmt::Debug for SecretState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretState::NotReferenced => f.write_str("NotReferenced"),
            SecretState::NotFound { name } => f.debug_struct("NotFound").field("name", name).finish(),
            SecretState::KeyNotFound { name, key } => {
                f.debug_struct("KeyNotFound").field("name", name).field("key", key).finish()
            }
            // The content stays out of debug output.
            SecretState::Found { name, key, data, extra } => f
                .debug_struct("Found")
                .field("name", name)
                .field("key", key)
                .field("bytes", &data.len())
                .field("extra", &extra.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>())
                .finish(),
            SecretState::Unreadable { name, error } => {
                f.debug_struct("Unreadable").field("name", name).field("error", error).finish()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::validate::testing::{found, found_with_credentials};

    #[test]
    fn secret_state_debug_hides_the_content() {
        let s = format!("{:?}", found(b"password=hunter2"));
        assert!(!s.contains("hunter2"), "{s}");
        let s = format!("{:?}", found_with_credentials(b"[Global]", b"aws_secret_access_key=hunter2"));
        assert!(!s.contains("hunter2"), "{s}");
    }
}
