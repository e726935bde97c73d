//! Integration tests: the test API server driven with `kube::Client`, kube-runtime and kubectl.
//! One test binary (modules below) keeps link time down.

mod backend;
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
