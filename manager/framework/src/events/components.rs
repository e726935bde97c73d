//! Event source components: who an event says it comes from. Upstream's names, so event
//! filters written for an upstream manager keep working. A provider that publishes on behalf
//! of a controller (a load balancer's health, say) uses that controller's name.

/// The service load-balancer controller (upstream's).
pub const SERVICE_CONTROLLER: &str = "service-controller";

/// The route controller (upstream's, with its underscore).
pub const ROUTE_CONTROLLER: &str = "route_controller";
