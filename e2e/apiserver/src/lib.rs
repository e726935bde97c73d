//! In-memory Kubernetes API server for tests.
