//! L2 announcement: ARP (IPv4) and NDP (IPv6) answers for each address from the one node
//! elected for it, and gratuitous announcements when that node changes.
//!
//! The pieces: [`super::elect`] (which node), [`super::plan`] (what to send when ownership
//! changes), [`super::codec`] (the frames), [`super::responder`] (the packet sockets).

use serde::Deserialize;

use ccm_framework::safe_yaml::{DocumentError, FieldPath};

/// Most interfaces one announcer answers on.
pub const MAX_INTERFACES: usize = 16;

/// The message of an empty interface list.
pub const NO_INTERFACES: &str = "must list at least one interface";
/// The message of too long an interface list.
pub const TOO_MANY_INTERFACES: &str = "must list at most 16 interfaces";
/// The message of an interface name Linux would refuse.
pub const BAD_INTERFACE: &str = "must be an interface name: 1-15 bytes, no '/', ':', whitespace or NUL";
/// The message of an interface listed twice.
pub const DUPLICATE_INTERFACE: &str = "is listed twice";

/// Every fixed message [`L2Config::validate`] may raise, for the cloud-config's schema.
pub const MESSAGES: &[&str] = &[NO_INTERFACES, TOO_MANY_INTERFACES, BAD_INTERFACE, DUPLICATE_INTERFACE];

/// `loadBalancer.announcement.l2`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct L2Config {
    /// The node interfaces on the segment clients share with the addresses (`eth0`, `bond0`,
    /// `eth0.100`): ARP and NDP are answered, and announcements sent, on each.
    #[serde(default)]
    pub interfaces: Vec<String>,
}

/// Whether Linux accepts `name` as an interface name (`dev_valid_name`).
pub fn valid_interface_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == b':' || b == 0 || b.is_ascii_whitespace())
}

impl L2Config {
    /// Check the interface list; `path` is `loadBalancer.announcement.l2`.
    pub fn validate(&self, path: &FieldPath) -> Result<(), DocumentError> {
        let list = path.field("interfaces");
        if self.interfaces.is_empty() {
            return Err(DocumentError::invalid(list, NO_INTERFACES));
        }
        if self.interfaces.len() > MAX_INTERFACES {
            return Err(DocumentError::invalid(list, TOO_MANY_INTERFACES));
        }
        for (i, name) in self.interfaces.iter().enumerate() {
            if !valid_interface_name(name) {
                return Err(DocumentError::invalid(list.index(i), BAD_INTERFACE));
            }
            if self.interfaces[..i].contains(name) {
                return Err(DocumentError::invalid(list.index(i), DUPLICATE_INTERFACE));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> FieldPath {
        FieldPath::root().field("loadBalancer").field("announcement").field("l2")
    }

    fn check(interfaces: &[&str]) -> Result<(), String> {
        let config = L2Config { interfaces: interfaces.iter().map(|s| s.to_string()).collect() };
        config.validate(&path()).map_err(|e| e.to_string())
    }

    #[test]
    fn interface_errors_name_the_field_and_entry() {
        assert!(check(&["eth0", "bond0.100"]).is_ok());
        let empty = check(&[]).unwrap_err();
        assert!(empty.contains("loadBalancer.announcement.l2.interfaces") && empty.contains(NO_INTERFACES), "{empty}");
        let bad = check(&["eth0", "a very long interface"]).unwrap_err();
        assert!(bad.contains("interfaces[1]") && bad.contains(BAD_INTERFACE), "{bad}");
        let twice = check(&["eth0", "eth0"]).unwrap_err();
        assert!(twice.contains("interfaces[1]") && twice.contains(DUPLICATE_INTERFACE), "{twice}");
        let many: Vec<String> = (0..17).map(|i| format!("eth{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(check(&many).unwrap_err().contains(TOO_MANY_INTERFACES));
        for name in ["", ".", "..", "a/b", "a:b", "a b", "0123456789abcdef"] {
            assert!(!valid_interface_name(name), "{name:?}");
        }
    }

    #[test]
    fn the_cloud_config_names_the_full_path_of_an_l2_mistake() {
        let doc = "loadBalancer:\n  announcement:\n    l2:\n      interfaces: [eth0, \"eth0/1\"]\n";
        let error = crate::config::parse(doc.as_bytes()).unwrap_err().to_string();
        assert!(
            error.contains("loadBalancer.announcement.l2.interfaces[1]") && error.contains(BAD_INTERFACE),
            "{error}"
        );
        let doc = "loadBalancer:\n  announcement:\n    l2:\n      interfacs: [eth0]\n";
        let error = crate::config::parse(doc.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("loadBalancer.announcement.l2") && error.contains("interfaces"), "{error}");
        let ok = crate::config::parse(b"loadBalancer:\n  announcement:\n    l2:\n      interfaces: [bond0]\n").unwrap();
        assert_eq!(ok.load_balancer.announcement.l2.unwrap().interfaces, ["bond0"]);
    }
}
