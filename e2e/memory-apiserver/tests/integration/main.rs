//! The in-memory API server's integration tests, driven with `kube::Client`, kube-runtime and
//! kubectl. One test binary keeps link time down; run one module with
//! `cargo test -p memory-apiserver --test integration watch::`.
//!
//! - `common`: what the modules share beyond the test kit's.
//! - `crd`: CustomResourceDefinitions: registration, serving, status subresource, removal.
//! - `crud`: create, get, update, delete and the Status errors.
//! - `differential`: one request sequence against this server and a genuine kube-apiserver,
//!   responses compared (genuine half needs `CCM_TEST_ASSETS`).
//! - `faults`: fault injection and the request log, in process and over `/_test`.
//! - `kubectl`: the real kubectl: apply --server-side, get (table and JSON), wait, delete.
//! - `lifecycle`: deletion: finalizers, preconditions, garbage collection, namespaces.
//! - `list`: pagination, label and field selectors, deletecollection.
//! - `patch`: merge, JSON and strategic merge patches, server-side apply and field ownership.
//! - `runtime`: kube-runtime's watcher, reflector and Controller, also after watch drops and 410s.
//! - `sandbox`: the sandbox builder: server, CRDs and components.
//! - `secrets`: Secret `stringData` folded into `data` and never stored.
//! - `services`: Service cluster IP and node port allocation.
//! - `watch`: resume by resourceVersion, bookmarks, initial events, timeouts, 410 Gone.

mod common;
mod crd;
mod crud;
mod differential;
mod faults;
mod kubectl;
mod lifecycle;
mod list;
mod patch;
mod runtime;
mod sandbox;
mod secrets;
mod services;
mod watch;
