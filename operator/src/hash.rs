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

/// Hash of a cloud-config: the key and the value's bytes, salted with the resource's UID so that
/// the same content hashes differently per resource and cluster (no precomputed table matches
/// it). Only this hash leaves the operator, never the content.
pub fn cloud_config(salt: &str, key: &str, data: &[u8]) -> String {
    digest(&[b"cloud-config", salt.as_bytes(), key.as_bytes(), data])
}

/// `hash` (of a cloud-config) folded with the key and value of a file mounted beside it.
pub fn extra_key(hash: &str, key: &str, data: &[u8]) -> String {
    digest(&[b"extra-key", hash.as_bytes(), key.as_bytes(), data])
}

/// Hash of the part of a cloud-config whose change needs a restart (a provider's restart
/// fingerprint), under the same key and salt.
pub fn cloud_config_restart(salt: &str, key: &str, fingerprint: &[u8]) -> String {
    digest(&[b"cloud-config-restart", salt.as_bytes(), key.as_bytes(), fingerprint])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_changes_with_content_and_is_stable() {
        let a = cloud_config("uid", "cloud.conf", b"one");
        assert_eq!(a, cloud_config("uid", "cloud.conf", b"one"));
        assert_ne!(a, cloud_config("uid", "cloud.conf", b"two"));
        assert_ne!(a, cloud_config("uid", "other", b"one"));
        assert_eq!(a.len(), 32);
    }

    #[test]
    fn the_same_cloud_config_hashes_differently_for_each_resource() {
        assert_ne!(cloud_config("uid-a", "cloud.conf", b"one"), cloud_config("uid-b", "cloud.conf", b"one"));
        assert_ne!(cloud_config_restart("uid-a", "k", b"f"), cloud_config_restart("uid-b", "k", b"f"));
    }

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(digest(&[b"ab", b"c"]), digest(&[b"a", b"bc"]));
    }
}
