//! The cloud-controller-manager framework.
