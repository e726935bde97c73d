//! The ccm-operator library.
