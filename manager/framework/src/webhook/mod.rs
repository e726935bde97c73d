//! Admission webhooks (KEP-2699): providers register them, the manager serves them.
//!
//! A provider hands its webhooks over with
//! [`Registry::register_with_webhooks`](crate::registry::Registry::register_with_webhooks); the
//! program serves those `--webhooks` selects on their own HTTPS listener
//! (`--webhook-bind-address:--webhook-secure-port`, `--webhook-tls-*`, apart from the metrics
//! endpoint), when `--feature-gates=CloudControllerManagerWebhook=true`, as upstream. Every
//! replica serves, leader or not: the API server calls whichever the webhook's Service picks.
//!
//! - [`review`]: the AdmissionReview a webhook receives and answers (pure).
//! - [`server`]: dispatch by path, bounded bodies and time, upstream's metrics.

pub mod review;
pub mod server;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Service;

use crate::controllers::service::logic::{ClassFilter, wants_load_balancer};
use crate::error::Error;
use crate::serving::HttpConfig;

pub use review::{Admission, AdmissionRequest};

/// The largest AdmissionReview a webhook accepts unless it says otherwise: an object and its
/// previous version of the API server's largest size (1.5 MiB each), with room.
pub const DEFAULT_MAX_BODY_BYTES: usize = 3 * 1024 * 1024 + 64 * 1024;

/// How long a webhook may take to decide; the API server's own default timeout is 10 s.
pub const ADMIT_TIME_LIMIT: Duration = Duration::from_secs(8);

/// Upstream's `--webhook-secure-port` default.
pub const DEFAULT_WEBHOOK_PORT: u16 = 10260;

/// What every webhook may need about the manager it runs in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionContext {
    /// `--load-balancer-class`.
    pub load_balancer_class: Option<String>,
    /// `--handle-unclassed-services`.
    pub handle_unclassed_services: bool,
}

impl AdmissionContext {
    /// Whether this manager's service controller would give `service` a load balancer (type
    /// `LoadBalancer` and a class it takes, S1 and S28): a Service webhook leaves others alone.
    pub fn takes_service(&self, service: &Service) -> bool {
        let filter =
            ClassFilter { class: self.load_balancer_class.as_deref(), also_unclassed: self.handle_unclassed_services };
        wants_load_balancer(service, filter)
    }
}

/// One admission webhook of a provider.
#[async_trait]
pub trait AdmissionWebhook: Send + Sync + 'static {
    /// Its name in `--webhooks` (a DNS label is wise).
    fn name(&self) -> &str;

    /// The URL path it is served at (`/validate-...`); unique among a provider's webhooks.
    fn path(&self) -> &str;

    /// Whether `--webhooks=*` serves it (upstream's disabled-by-default list).
    fn enabled_by_default(&self) -> bool {
        true
    }

    /// The largest AdmissionReview body it reads; larger ones are answered 413.
    fn max_body_bytes(&self) -> usize {
        DEFAULT_MAX_BODY_BYTES
    }

    /// Decide on `request`. An `Err` is answered 500 (the API server then applies the
    /// webhook's `failurePolicy`); its text names the problem, never secrets.
    async fn admit(&self, ctx: &AdmissionContext, request: &AdmissionRequest) -> Result<Admission, String>;
}

impl std::fmt::Debug for dyn AdmissionWebhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionWebhook").field("name", &self.name()).field("path", &self.path()).finish()
    }
}

/// Which of `webhooks` `--webhooks` enables, by upstream's rule: the first entry naming a
/// webhook (`name` or `-name`) decides; otherwise `*` enables it unless it is disabled by
/// default; without `*`, nothing. An entry naming no webhook of the provider is refused.
pub fn select(
    entries: &[String],
    webhooks: &[Arc<dyn AdmissionWebhook>],
) -> Result<Vec<Arc<dyn AdmissionWebhook>>, Error> {
    let entries: Vec<&str> = entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()).collect();
    let names: Vec<&str> = webhooks.iter().map(|w| w.name()).collect();
    for entry in &entries {
        let name = entry.strip_prefix('-').unwrap_or(entry);
        if *entry != "*" && !names.contains(&name) {
            return Err(Error::InvalidFlag {
                flag: "--webhooks",
                message: format!(
                    "{name:?} is not in the list of known webhooks ({})",
                    if names.is_empty() { "the provider has none".to_string() } else { names.join(", ") }
                ),
            });
        }
    }
    let star = entries.contains(&"*");
    Ok(webhooks
        .iter()
        .filter(|w| {
            let explicit = entries.iter().find_map(|e| match e.strip_prefix('-') {
                Some(n) if n == w.name() => Some(false),
                None if *e == w.name() => Some(true),
                _ => None,
            });
            explicit.unwrap_or(star && w.enabled_by_default())
        })
        .cloned()
        .collect())
}

/// The webhook server's settings from the command line (`--webhook-*`), before the provider
/// is known: serving happens only when the gate is on, the port is not 0 and `--webhooks`
/// selects at least one of the provider's webhooks.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// `--webhooks` as given.
    pub selection: Vec<String>,
    /// Address, TLS and limits of the listener (no delegated auth: the API server calls it).
    pub http: HttpConfig,
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Named(&'static str, bool);

    #[async_trait]
    impl AdmissionWebhook for Named {
        fn name(&self) -> &str {
            self.0
        }
        fn path(&self) -> &str {
            "/x"
        }
        fn enabled_by_default(&self) -> bool {
            self.1
        }
        async fn admit(&self, _: &AdmissionContext, _: &AdmissionRequest) -> Result<Admission, String> {
            Ok(Admission::allowed())
        }
    }

    fn selected(entries: &[&str]) -> Result<Vec<String>, Error> {
        let all: Vec<Arc<dyn AdmissionWebhook>> = vec![Arc::new(Named("a", true)), Arc::new(Named("b", false))];
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        Ok(select(&entries, &all)?.iter().map(|w| w.name().to_string()).collect())
    }

    #[test]
    fn webhooks_are_selected_by_upstreams_rule_and_unknown_names_refused() {
        assert!(selected(&[]).unwrap().is_empty(), "none by default, as upstream");
        assert_eq!(selected(&["*"]).unwrap(), ["a"], "b is disabled by default");
        assert_eq!(selected(&["*", "b"]).unwrap(), ["a", "b"]);
        assert_eq!(selected(&["-a", "*"]).unwrap(), Vec::<String>::new());
        assert_eq!(selected(&["b"]).unwrap(), ["b"]);
        assert_eq!(selected(&["a", "-a"]).unwrap(), ["a"], "the first entry naming it wins");
        match selected(&["*", "-c"]) {
            Err(Error::InvalidFlag { flag, message }) => {
                assert_eq!(flag, "--webhooks");
                assert!(message.contains("\"c\"") && message.contains("a, b"), "{message}");
            }
            other => panic!("refused expected, got {other:?}"),
        }
    }

    #[test]
    fn the_context_takes_the_services_the_service_controller_takes() {
        let svc = |class: Option<&str>, kind: &str| Service {
            spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
                type_: Some(kind.into()),
                load_balancer_class: class.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        };
        let upstream = AdmissionContext::default();
        assert!(upstream.takes_service(&svc(None, "LoadBalancer")));
        assert!(!upstream.takes_service(&svc(Some("other"), "LoadBalancer")));
        assert!(!upstream.takes_service(&svc(None, "ClusterIP")));
        let classed = AdmissionContext { load_balancer_class: Some("x".into()), handle_unclassed_services: true };
        assert!(classed.takes_service(&svc(Some("x"), "LoadBalancer")));
        assert!(classed.takes_service(&svc(None, "LoadBalancer")));
    }
}
