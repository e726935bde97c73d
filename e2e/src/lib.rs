//! End-to-end helpers.
