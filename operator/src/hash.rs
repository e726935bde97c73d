//! Content hashes for annotations: stable across processes and releases (SHA-256), short.

use serde::Serialize;

/// Hex of the first 16 bytes of SHA-256 over `parts`, each prefixed by its length so that
/// `["ab", "c"]` and `["a", "bc"]` differ.
pub fn digest(parts: &[&[u8]]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    ctx.finish().as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Hash of a value's JSON form. k8s-openapi types serialize fields in a fixed order and maps
/// as sorted `BTreeMap`s, so equal values hash equally.
pub fn of_json<T: Serialize>(value: &T) -> String {
    // Serializing plain data into a Vec cannot fail; an empty input still hashes deterministically.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    digest(&[&bytes])
}

/// Hash of a cloud-config: the key and the value's bytes. Only this hash leaves the operator,
/// never the content.
pub fn cloud_config(key: &str, data: &[u8]) -> String {
    digest(&[b"cloud-config", key.as_bytes(), data])
}

/// Hash of the part of a cloud-config whose change needs a restart (a provider's restart
/// fingerprint), under the same key.
pub fn cloud_config_restart(key: &str, fingerprint: &[u8]) -> String {
    digest(&[b"cloud-config-restart", key.as_bytes(), fingerprint])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_changes_with_content_and_is_stable() {
        let a = cloud_config("cloud.conf", b"one");
        assert_eq!(a, cloud_config("cloud.conf", b"one"));
        assert_ne!(a, cloud_config("cloud.conf", b"two"));
        assert_ne!(a, cloud_config("other", b"one"));
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(digest(&[b"ab", b"c"]), digest(&[b"a", b"bc"]));
    }
}
