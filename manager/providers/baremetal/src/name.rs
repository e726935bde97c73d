//! The provider's name: what it is registered under, and the scheme of the providerIDs it derives
//! for instances that name none.

/// The registered provider name.
pub const NAME: &str = "baremetal";
