//! The CloudControllerManager controller: watches, the reconcile pipeline, cleanup.
//!
//! One job per file: [`wiring`] sets the watches up and maps their events to CRs;
//! [`pipeline`] runs one reconcile through its steps ([`dereference_step`] →
//! [`validate_step`] → [`apply_step`] → [`observe`] → status ([`status_write`]) →
//! [`events`]); [`teardown`] deletes what a CR no longer has; [`memory`] is what is
//! remembered of each CR between reconciles; [`context`] is what every step works with.

pub mod apply_step;
pub mod context;
pub mod dereference_step;
pub mod events;
pub mod memory;
pub mod observe;
pub mod pipeline;
pub mod status_write;
pub mod teardown;
pub mod validate_step;
pub mod wiring;

pub use context::{DEBOUNCE, Guarded, Shared, Timings};
pub use observe::awaiting_observation;
pub use pipeline::backoff;
pub use teardown::{TEARDOWN_GRACE, teardown_waits};
pub use wiring::run;
