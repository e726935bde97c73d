//! `--feature-gates`: upstream's gates, read (pure). Two change what this manager does; the
//! rest of upstream v1.36's are accepted with a warning, as is a name upstream does not know
//! (upstream refuses it; a manifest written for a later version keeps starting here).

use super::invalid;
use crate::error::Error;
use crate::go_values::parse_bool;

/// KEP-5237: routes reconciled on Node changes with a long safety period instead of every
/// `--route-reconciliation-period`. Alpha (off) in upstream v1.35 and v1.36, the version this
/// manager follows, so off here too: a v1.36 manifest keeps its 10 s route passes.
pub const WATCH_BASED_ROUTES: &str = "CloudControllerManagerWatchBasedRoutesReconciliation";

/// KEP-2699: serve the providers' admission webhooks (`--webhooks`, `--webhook-*`). Alpha, off by
/// default, as upstream.
pub const WEBHOOK: &str = "CloudControllerManagerWebhook";

/// Upstream's gate for releasing the Lease on exit; here `--leader-elect-release-on-shutdown`
/// (on by default) does that.
pub const RELEASE_LOCK_ON_EXIT: &str = "ControllerManagerReleaseLeaderElectionLockOnExit";

/// Sets every alpha gate not named explicitly.
pub const ALL_ALPHA: &str = "AllAlpha";
/// Sets every beta gate not named explicitly.
pub const ALL_BETA: &str = "AllBeta";

/// Upstream v1.36's other gates (component-base, apiserver, client-go): none has an effect here.
const WITHOUT_EFFECT: [&str; 33] = [
    RELEASE_LOCK_ON_EXIT,
    "APIResponseCompression",
    "APIServerIdentity",
    "APIServingWithRoutine",
    "AllowParsingUserUIDFromCertAuth",
    "AllowUnsafeMalformedObjectDeletion",
    "CBORServingAndStorage",
    "ComponentFlagz",
    "ComponentStatusz",
    "ConcurrentWatchObjectDecode",
    "ConstrainedImpersonation",
    "ContextualLogging",
    "CoordinatedLeaderElection",
    "DeclarativeValidationBeta",
    "DetectCacheInconsistency",
    "ListFromCacheSnapshot",
    "LoggingAlphaOptions",
    "LoggingBetaOptions",
    "ManifestBasedAdmissionControlConfig",
    "NativeHistograms",
    "OpenAPIEnums",
    "RemoteRequestHeaderUID",
    "ShardedListAndWatch",
    "SizeBasedListCostEstimate",
    "StorageVersionAPI",
    "StorageVersionHash",
    "StructuredAuthenticationConfigurationEgressSelector",
    "StructuredAuthenticationConfigurationJWKSMetrics",
    "TokenRequestServiceAccountUIDValidation",
    "UnauthenticatedHTTP2DOSMitigation",
    "UnknownVersionInteroperabilityProxy",
    "WatchCacheInitializationPostStartHook",
    "WatchList",
];

/// Gates upstream v1.37 adds (k8s.io/apiserver v0.37.0-beta.0, the newest published; its
/// cloud-provider, controller-manager and component-base add none, nor any flag): a manifest
/// written for v1.37 names them, and none has an effect here.
const ADDED_IN_1_37: [&str; 5] = [
    "ConsistentListFromCacheSkipTimeoutFallback",
    "EtcdRangeStream",
    "ExcludeAdmissionWebhookVirtualResources",
    "WatchListCompression",
    "WebhookRoundTripLoadBalancing",
];

/// Every gate name upstream v1.36 lists, for tests and docs.
pub fn known_gates() -> Vec<&'static str> {
    let mut all = vec![WATCH_BASED_ROUTES, WEBHOOK, ALL_ALPHA, ALL_BETA];
    all.extend(WITHOUT_EFFECT);
    all
}

/// The gates that change something here, resolved (every one off by default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// [`WATCH_BASED_ROUTES`] (alpha, default off).
    pub watch_based_routes: bool,
    /// [`WEBHOOK`] (alpha, default off).
    pub webhook: bool,
}

/// What `--feature-gates` set: the gates, and one warning per accepted name without effect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedGates {
    /// The resolved gates.
    pub gates: FeatureGates,
    /// Warning lines.
    pub warnings: Vec<String>,
}

/// Read every `--feature-gates` value (each `Name=bool,...`; a name alone means true). A value
/// that is not a boolean is refused naming the gate. An explicitly named gate wins over
/// `AllAlpha`/`AllBeta`, whatever the order, as upstream.
pub fn parse(values: &[String]) -> Result<ParsedGates, Error> {
    let mut named: Vec<(String, bool)> = Vec::new();
    for entry in values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|e| !e.is_empty()) {
        let (name, value) = entry.split_once('=').unwrap_or((entry, "true"));
        let (name, value) = (name.trim(), value.trim());
        let enabled = parse_bool(value).map_err(|e| invalid("--feature-gates", format!("{name}: {e}")))?;
        named.retain(|(n, _)| n != name);
        named.push((name.to_string(), enabled));
    }
    let get = |name: &str| named.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let mut out = ParsedGates::default();
    out.gates.watch_based_routes = get(WATCH_BASED_ROUTES).or(get(ALL_ALPHA)).unwrap_or(false);
    out.gates.webhook = get(WEBHOOK).or(get(ALL_ALPHA)).unwrap_or(false);
    for (name, _) in &named {
        if name == RELEASE_LOCK_ON_EXIT {
            out.warnings.push(format!(
                "--feature-gates: {name} has no effect here: the Lease is released on shutdown unless --leader-elect-release-on-shutdown=false"
            ));
        } else if WITHOUT_EFFECT.contains(&name.as_str()) {
            out.warnings.push(format!("--feature-gates: {name} is accepted for compatibility but has no effect here"));
        } else if ADDED_IN_1_37.contains(&name.as_str()) {
            out.warnings.push(format!("--feature-gates: {name} is upstream v1.37's and has no effect here"));
        } else if ![WATCH_BASED_ROUTES, WEBHOOK, ALL_ALPHA, ALL_BETA].contains(&name.as_str()) {
            out.warnings.push(format!("--feature-gates: {name} is not a feature gate of this manager; ignored"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(values: &[&str]) -> ParsedGates {
        parse(&values.iter().map(|v| v.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn watch_based_routes_and_webhooks_are_off_by_default_as_upstream_v1_36() {
        assert_eq!(gates(&[]).gates, FeatureGates { watch_based_routes: false, webhook: false });
        assert!(gates(&[]).warnings.is_empty());
    }

    #[test]
    fn named_gates_win_over_all_alpha_and_all_beta_whatever_the_order() {
        let g = gates(&["AllAlpha=true,AllBeta=false"]).gates;
        assert_eq!(g, FeatureGates { watch_based_routes: true, webhook: true });
        let g =
            gates(&[&format!("{WATCH_BASED_ROUTES}=false"), "AllBeta=true", &format!("{WEBHOOK}=false,AllAlpha=true")]);
        assert_eq!(g.gates, FeatureGates { watch_based_routes: false, webhook: false });
        // Repeated flags add up; a later value of the same gate wins.
        let g = gates(&[&format!("{WEBHOOK}=true"), &format!("{WEBHOOK}=false")]);
        assert!(!g.gates.webhook);
        assert!(gates(&[WEBHOOK]).gates.webhook, "a name alone means true");
    }

    #[test]
    fn gates_upstream_v1_37_adds_start_the_manager_with_a_warning_naming_v1_37() {
        for name in ADDED_IN_1_37 {
            let parsed = gates(&[&format!("{name}=true")]);
            assert_eq!(parsed.gates, FeatureGates::default(), "{name} changes nothing");
            assert_eq!(
                parsed.warnings,
                vec![format!("--feature-gates: {name} is upstream v1.37's and has no effect here")]
            );
            assert!(!known_gates().contains(&name), "{name} is not one of v1.36's");
        }
    }

    #[test]
    fn gates_without_effect_and_unknown_names_warn_and_bad_values_are_refused() {
        let g = gates(&["WatchList=false,ContextualLogging=true,NotAGate=true", RELEASE_LOCK_ON_EXIT]);
        assert_eq!(g.warnings.len(), 4, "{:?}", g.warnings);
        assert!(g.warnings.iter().any(|w| w.contains("NotAGate") && w.contains("not a feature gate")));
        assert!(g.warnings.iter().any(|w| w.contains("--leader-elect-release-on-shutdown")));
        match parse(&["WatchList=maybe".to_string()]) {
            Err(Error::InvalidFlag { flag, message }) => {
                assert_eq!(flag, "--feature-gates");
                assert!(message.contains("WatchList"), "{message}");
            }
            other => panic!("refused expected, got {other:?}"),
        }
        assert_eq!(known_gates().len(), 37);
    }
}
