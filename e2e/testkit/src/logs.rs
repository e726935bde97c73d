//! Logs of the code under test in the test's captured output.

/// Logs to the test's captured output, filtered by `RUST_LOG`; the first call in the process
/// installs the subscriber, later ones keep it.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}
