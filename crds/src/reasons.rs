//! Every condition reason and event reason of the project, in one module of the API crate:
//! the operator's, the manager's (`ProviderHealthy`) and the `Ready` summary's. A test checks
//! that docs/troubleshooting.md explains each one.

/// Reasons of the `Ready` summary condition.
pub mod ready {
    /// Ready=True: everything is as expected.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Ready=False: `ConfigValid` is False.
    pub const CONFIG_INVALID: &str = "ConfigInvalid";
    /// Ready=False: `Degraded` is True.
    pub const DEGRADED: &str = "Degraded";
    /// Ready=False: `ProviderHealthy` is False.
    pub const PROVIDER_UNHEALTHY: &str = "ProviderUnhealthy";
    /// Ready=False: `Available` is False.
    pub const UNAVAILABLE: &str = "Unavailable";
    /// Ready=False: `Progressing` is True.
    pub const PROGRESSING: &str = "Progressing";
    /// Ready=Unknown: some input condition is missing or Unknown.
    pub const AWAITING_STATUS: &str = "AwaitingStatus";

    /// Every reason the `Ready` computation can produce.
    pub const ALL: [&str; 7] =
        [AS_EXPECTED, CONFIG_INVALID, DEGRADED, PROVIDER_UNHEALTHY, UNAVAILABLE, PROGRESSING, AWAITING_STATUS];
}

/// Reasons of `ConfigValid`.
pub mod config_valid {
    /// True: the spec, its Secret and the cloud-config are usable.
    pub const VALID: &str = "Valid";
    /// False: a field breaks a rule of the CRD (the API server did not enforce it).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// False: the object could not be read as a CloudControllerManager (wrong types).
    pub const MALFORMED_SPEC: &str = "MalformedSpec";
    /// False: no provider of that name is built in; the message lists the known ones.
    pub const UNKNOWN_PROVIDER: &str = "UnknownProvider";
    /// False: the referenced Secret does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// False: the referenced Secret has no such key.
    pub const SECRET_KEY_NOT_FOUND: &str = "SecretKeyNotFound";
    /// False: the provider's own parser rejected the cloud-config.
    pub const CLOUD_CONFIG_REJECTED: &str = "CloudConfigRejected";
    /// False: routes are enabled for a provider that programs routes, but `clusterCIDR` is unset.
    pub const CLUSTER_CIDR_REQUIRED: &str = "ClusterCIDRRequired";
    /// False: an older CloudControllerManager already runs an overlapping controller.
    pub const CONFLICT: &str = "Conflict";
    /// Unknown: the Secret could not be read (an API error); kept until a read succeeds.
    pub const SECRET_UNREADABLE: &str = "SecretUnreadable";
    /// False: the resource's namespace is not one the operator may read cloud-config Secrets
    /// and run managers in (`--cloud-config-namespaces`, the chart's `cloudConfig.namespaces`).
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// False: `spec.mode` is Embedded but this operator was installed without Embedded mode (the
    /// chart's `embedded.enabled`, `--embedded-enabled`), so it lacks the manager's rights.
    pub const EMBEDDED_NOT_ENABLED: &str = "EmbeddedNotEnabled";
    /// False: the cloud-config asks for a proxy data path (baremetal `loadBalancer.mode: proxy`)
    /// whose listeners would open in a Pod's own network namespace, out of the Node's reach.
    pub const PROXY_NEEDS_HOST_NETWORK: &str = "ProxyNeedsHostNetwork";
    /// False: `spec.mode` is Embedded and `spec.extraArgs` is set; the embedded engine takes no
    /// command line, so the arguments would be ignored.
    pub const EXTRA_ARGS_NOT_SUPPORTED: &str = "ExtraArgsNotSupported";
    /// False: an object under a child's name (ServiceAccount, bindings, Role, workload, PDB, the
    /// ClusterRoleBinding) exists and is not this resource's; it is left untouched and nothing
    /// is applied.
    pub const NAME_CONFLICT: &str = "NameConflict";
    /// False: `metadata.name` is a core component's leader-election Lease name (or its prefix),
    /// which the manager's Lease, named after the resource, would compete for.
    pub const RESERVED_NAME: &str = "ReservedName";
    /// False: the spec asks for more than the installation allows resource authors: an image
    /// outside the allow-list, an `extraArgs` flag outside the allowed ones, more replicas than
    /// the maximum, or a priority class not on the list. The message names the field.
    pub const NOT_ALLOWED_BY_POLICY: &str = "NotAllowedByPolicy";
    /// False: a cloud-controller-manager this operator does not run holds the Lease upstream
    /// CCMs elect on (or their migration Lease), and the resource does not take over by leader
    /// migration: it starts nothing that would compete (what runs keeps running).
    pub const FOREIGN_MANAGER: &str = "ForeignManager";

    /// Every reason of `ConfigValid`.
    pub const ALL: [&str; 18] = [
        VALID,
        INVALID_SPEC,
        MALFORMED_SPEC,
        UNKNOWN_PROVIDER,
        SECRET_NOT_FOUND,
        SECRET_KEY_NOT_FOUND,
        CLOUD_CONFIG_REJECTED,
        CLUSTER_CIDR_REQUIRED,
        CONFLICT,
        SECRET_UNREADABLE,
        NAMESPACE_NOT_ALLOWED,
        EMBEDDED_NOT_ENABLED,
        PROXY_NEEDS_HOST_NETWORK,
        EXTRA_ARGS_NOT_SUPPORTED,
        NAME_CONFLICT,
        RESERVED_NAME,
        NOT_ALLOWED_BY_POLICY,
        FOREIGN_MANAGER,
    ];
}

/// Reasons of `Available`.
pub mod available {
    /// True: a manager replica (or the embedded engine) runs and a fresh Lease holder exists.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// False: nothing is deployed, because the configuration is invalid or conflicts.
    pub const NOT_DEPLOYED: &str = "NotDeployed";
    /// False: the workload exists but no replica is available.
    pub const NO_AVAILABLE_REPLICAS: &str = "NoAvailableReplicas";
    /// False: no replica holds the leader-election Lease, or the holder stopped renewing it.
    pub const NO_LEADER: &str = "NoLeader";
    /// False: the embedded engine is not running.
    pub const ENGINE_NOT_RUNNING: &str = "EngineNotRunning";
    /// False: the DaemonSet matches no Node (its nodeSelector and tolerations select none).
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";

    /// Every reason of `Available`.
    pub const ALL: [&str; 6] =
        [AS_EXPECTED, NOT_DEPLOYED, NO_AVAILABLE_REPLICAS, NO_LEADER, ENGINE_NOT_RUNNING, NO_MATCHING_NODES];
}

/// Reasons of `Progressing`.
pub mod progressing {
    /// False: nothing is rolling out.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// True: a new pod template (spec, image or cloud-config change) is rolling out.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// True: the embedded engine is (re)starting after a spec or cloud-config change.
    pub const ENGINE_STARTING: &str = "EngineStarting";
    /// True: a Deployment ↔ DaemonSet switch keeps the previous mode's workload serving until
    /// the new one has an available Pod (or, on the host network, a Node to run on).
    pub const MODE_SWITCHING: &str = "ModeSwitching";

    /// Every reason of `Progressing`.
    pub const ALL: [&str; 4] = [AS_EXPECTED, ROLLING_OUT, ENGINE_STARTING, MODE_SWITCHING];
}

/// Reasons of `Degraded`.
pub mod degraded {
    /// False: no failure.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// True at once: `ConfigValid` is False, so the manager cannot run as specified.
    pub const CONFIG_INVALID: &str = "ConfigInvalid";
    /// True at once: the workload reports that its rollout exceeded its progress deadline.
    pub const ROLLOUT_STALLED: &str = "RolloutStalled";
    /// True at once: the embedded engine failed to start or stopped with an error.
    pub const ENGINE_FAILED: &str = "EngineFailed";
    /// True after the failure window: applying or pruning child objects keeps failing.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// True after the failure window: reading the cloud-config Secret keeps failing.
    pub const SECRET_UNREADABLE: &str = "SecretUnreadable";
    /// True at once: a manager container is in CrashLoopBackOff, or restarted and is not ready.
    pub const MANAGER_CRASH_LOOPING: &str = "ManagerCrashLooping";
    /// True at once: a manager container cannot start (image pull or container creation fails).
    pub const MANAGER_CANNOT_START: &str = "ManagerCannotStart";

    /// Every reason of `Degraded`.
    pub const ALL: [&str; 8] = [
        AS_EXPECTED,
        CONFIG_INVALID,
        ROLLOUT_STALLED,
        ENGINE_FAILED,
        APPLY_FAILED,
        SECRET_UNREADABLE,
        MANAGER_CRASH_LOOPING,
        MANAGER_CANNOT_START,
    ];
}

/// Reasons of `ProviderHealthy`: the operator's until a manager reports, then the manager's
/// (a provider's health probe picks one of [`provider_healthy::MANAGER`]).
pub mod provider_healthy {
    /// True: the probe passed.
    pub const HEALTHY: &str = "Healthy";
    /// False: the cloud rejected the credentials.
    pub const CREDENTIALS_REJECTED: &str = "CredentialsRejected";
    /// False: the cloud API endpoint could not be reached.
    pub const ENDPOINT_UNREACHABLE: &str = "EndpointUnreachable";
    /// False: the cloud API is rate-limiting the manager.
    pub const THROTTLED: &str = "Throttled";
    /// False: the cloud-config is invalid.
    pub const INVALID_CLOUD_CONFIG: &str = "InvalidCloudConfig";
    /// False: the provider's own probes of its instances are failing.
    pub const PROBE_FAILING: &str = "ProbeFailing";
    /// False: the manager could not run the probe (for example it timed out).
    pub const PROBE_ERROR: &str = "ProbeError";

    /// True: an upstream CCM image (`spec.upstream`): a replica's /healthz passes and a
    /// holder renews its Lease (upstream CCMs report no cloud health to the resource).
    pub const UPSTREAM_HEALTHZ: &str = "UpstreamHealthz";
    /// Unknown: the manager (or embedded engine) has not reported provider health yet.
    pub const AWAITING_MANAGER: &str = "AwaitingManager";
    /// Unknown: no manager runs (no ready replica and no fresh Lease holder, or the embedded
    /// engine is not running), so the last report no longer holds.
    pub const NO_MANAGER_RUNNING: &str = "NoManagerRunning";

    /// Every reason of `ProviderHealthy` the operator writes.
    pub const ALL: [&str; 3] = [AWAITING_MANAGER, NO_MANAGER_RUNNING, UPSTREAM_HEALTHZ];
    /// Every reason of `ProviderHealthy` the manager writes.
    pub const MANAGER: [&str; 7] = [
        HEALTHY,
        CREDENTIALS_REJECTED,
        ENDPOINT_UNREACHABLE,
        THROTTLED,
        INVALID_CLOUD_CONFIG,
        PROBE_FAILING,
        PROBE_ERROR,
    ];
}

/// Reasons of `ShadowAgrees`, which a manager in shadow mode writes (docs/shadow.md).
pub mod shadow_agrees {
    /// True: every enabled controller compared and none would act.
    pub const AGREES: &str = "Agrees";
    /// False: some controller would write or call the cloud; the message counts the
    /// differences by controller and kind, `status.shadow` lists the first ones.
    pub const DIFFERS: &str = "Differs";
    /// Unknown: some controller has not finished its first comparison.
    pub const COMPARING: &str = "Comparing";

    /// Every reason of `ShadowAgrees`.
    pub const ALL: [&str; 3] = [AGREES, DIFFERS, COMPARING];
}

/// Reasons of `Announcing`, which the operator writes with `spec.announcer`
/// (docs/l2-announcement.md, docs/bgp-announcement.md).
pub mod announcing {
    /// True: every live announcer is healthy and every BGP session it reports is established.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// Unknown: no announcer has a live Lease yet (none scheduled, or none started).
    pub const AWAITING_ANNOUNCERS: &str = "AwaitingAnnouncers";
    /// False: an announcer gives its addresses up (its Lease says why: an interface down, a
    /// stopped responder, kube-proxy failing); the message names the Nodes.
    pub const ANNOUNCER_UNHEALTHY: &str = "AnnouncerUnhealthy";
    /// False: a BGP session an announcer reports is not established; the message names the
    /// Nodes, peers, states and BIRD's last errors.
    pub const BGP_SESSION_DOWN: &str = "BGPSessionDown";

    /// Every reason of `Announcing`.
    pub const ALL: [&str; 4] = [AS_EXPECTED, AWAITING_ANNOUNCERS, ANNOUNCER_UNHEALTHY, BGP_SESSION_DOWN];
}

/// The condition the service controller writes into a Service's `status.conditions` when the
/// provider refuses it a load balancer, and the reasons a provider may give (the framework's
/// `provider::Refusal`); the reasons are also `Accepted=False`'s ([`load_balancer_state`]).
/// The condition is deprecated (kept for readers of earlier releases) and goes once the load
/// balancer exists.
pub mod service_load_balancer {
    /// Condition type: False while the provider refuses the Service a load balancer.
    pub const CONDITION_TYPE: &str = "LoadBalancerProvisioned";
    /// False: every address of every pool the Service may use is taken.
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    /// False: no pool is allowed for this Service (selectors, class, family or a named pool).
    pub const NO_POOL_MATCHES: &str = "NoPoolMatches";
    /// False: the sharing key names an address whose Services clash with this one (same port
    /// and protocol, or another sharing key).
    pub const SHARING_CONFLICT: &str = "SharingConflict";
    /// False: an address the Service requests is held by another Service.
    pub const REQUESTED_ADDRESS_TAKEN: &str = "RequestedAddressTaken";
    /// False: an address the Service requests is in no pool it may use, or not an address.
    pub const REQUESTED_ADDRESS_UNAVAILABLE: &str = "RequestedAddressUnavailable";
    /// False: an annotation of the Service is malformed; the message names it and the form.
    pub const INVALID_ANNOTATION: &str = "InvalidAnnotation";
    /// False: the Service asks for something this provider cannot do (a protocol, a port mix).
    pub const UNSUPPORTED_SERVICE: &str = "UnsupportedService";
    /// False: a limit of the cloud account stops the load balancer from being created.
    pub const QUOTA_EXCEEDED: &str = "QuotaExceeded";

    /// Every reason of the condition.
    pub const ALL: [&str; 8] = [
        POOL_EXHAUSTED,
        NO_POOL_MATCHES,
        SHARING_CONFLICT,
        REQUESTED_ADDRESS_TAKEN,
        REQUESTED_ADDRESS_UNAVAILABLE,
        INVALID_ANNOTATION,
        UNSUPPORTED_SERVICE,
        QUOTA_EXCEEDED,
    ];
}

/// The load-balancer state the service controller writes on every LoadBalancer Service it
/// handles, in KEP-6128's shape (docs/troubleshooting.md, "Load-balancer state on Services"):
/// three condition types and their reasons. `Accepted=False` takes its reason from
/// [`service_load_balancer`] (the provider's refusal).
pub mod load_balancer_state {
    /// Condition type: True once the provider took the Service, False while it refuses it.
    pub const ACCEPTED: &str = "Accepted";
    /// Condition type: True once the load balancer is made as the Service asks.
    pub const PROGRAMMED: &str = "Programmed";
    /// Condition type (abnormal-true): True while a load balancer serves the Service, but not
    /// as it asks or not fully.
    pub const DEGRADED: &str = "Degraded";

    /// `Programmed=True`: the last ensure succeeded.
    pub const PROGRAMMED_REASON: &str = "Programmed";
    /// `Degraded=False`: nothing is wrong.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// `Accepted=Unknown`: the provider has not answered yet (its calls failed).
    pub const PENDING: &str = "Pending";
    /// `Programmed=False`: the provider refused the Service (see `Accepted`).
    pub const NOT_ACCEPTED: &str = "NotAccepted";
    /// `Degraded=True`: the provider refused a change; the load balancer of before still serves.
    pub const CHANGE_REFUSED: &str = "ChangeRefused";
    /// `Programmed=False` or `Degraded=True`: the cloud API rate-limited the manager.
    pub const THROTTLED: &str = "Throttled";
    /// `Programmed=False` or `Degraded=True`: the cloud API could not be reached or failed.
    pub const CLOUD_UNAVAILABLE: &str = "CloudUnavailable";
    /// `Programmed=False` or `Degraded=True`: the cloud API rejected the credentials.
    pub const CLOUD_UNAUTHORIZED: &str = "CloudUnauthorized";
    /// `Programmed=False`: the cloud is still working on the load balancer.
    pub const IN_PROGRESS: &str = "InProgress";
    /// `Programmed=False` or `Degraded=True`: the provider's cloud-config is invalid.
    pub const INVALID_CLOUD_CONFIG: &str = "InvalidCloudConfig";
    /// `Programmed=False` or `Degraded=True`: another cloud error.
    pub const CLOUD_ERROR: &str = "CloudError";
    /// `Degraded=True`: no Node may serve the load balancer.
    pub const NO_HOSTS: &str = "NoHosts";
    /// `Degraded=True`: a Node change could not be given to the load balancer (retried).
    pub const HOST_UPDATE_FAILED: &str = "HostUpdateFailed";

    /// Every reason of the three conditions but the refusals' (and `Accepted`, the type's own).
    pub const ALL: [&str; 14] = [
        ACCEPTED,
        PROGRAMMED_REASON,
        AS_EXPECTED,
        PENDING,
        NOT_ACCEPTED,
        CHANGE_REFUSED,
        THROTTLED,
        CLOUD_UNAVAILABLE,
        CLOUD_UNAUTHORIZED,
        IN_PROGRESS,
        INVALID_CLOUD_CONFIG,
        CLOUD_ERROR,
        NO_HOSTS,
        HOST_UPDATE_FAILED,
    ];
}

/// The condition the `baremetal` provider writes on each `LoadBalancerIPPool`, and its reasons.
pub mod ip_pool {
    /// Condition type: True when the pool's addresses are handed out.
    pub const CONDITION_TYPE: &str = "Valid";
    /// True: every entry parses and overlaps no other pool.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// False: an entry is not a usable CIDR or range (the message names it by index).
    pub const INVALID_ENTRY: &str = "InvalidEntry";
    /// False: an entry overlaps a pool of the cloud-config or an older pool resource.
    pub const OVERLAP: &str = "Overlap";
    /// False: a pool of the cloud-config has the same name.
    pub const NAME_TAKEN: &str = "NameTaken";

    /// Every reason of the condition.
    pub const ALL: [&str; 4] = [AS_EXPECTED, INVALID_ENTRY, OVERLAP, NAME_TAKEN];
}

/// Reasons of the events the `baremetal` provider publishes on a MetalLB or Cilium pool it
/// imports (`loadBalancer.importPools`).
pub mod pool_import {
    /// Normal: the pool was imported as is.
    pub const IMPORTED: &str = "PoolImported";
    /// Warning: the pool was imported, but something of it could not be expressed (the note
    /// names each field and what is lost).
    pub const IMPORT_WARNING: &str = "PoolImportWarning";
    /// Warning: the pool was not imported (malformed, too large, or every address already in an
    /// earlier pool).
    pub const NOT_IMPORTED: &str = "PoolNotImported";
}

/// Reasons of Kubernetes Events the operator publishes on a CloudControllerManager.
pub mod events {
    /// Normal: child objects were created or changed (the note lists them).
    pub const APPLIED: &str = "Applied";
    /// Normal: child objects of another mode (or no longer wanted) were deleted.
    pub const PRUNED: &str = "Pruned";
    /// Warning: applying or pruning child objects failed.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// Warning: `ConfigValid` became False (the note carries its reason and message).
    pub const CONFIG_INVALID: &str = "ConfigInvalid";
    /// Normal: `ConfigValid` became True again.
    pub const CONFIG_VALID: &str = "ConfigValid";
    /// Normal: the embedded engine was started.
    pub const ENGINE_STARTED: &str = "EngineStarted";
    /// Normal: the embedded engine was stopped (mode switch, deletion, restart).
    pub const ENGINE_STOPPED: &str = "EngineStopped";
    /// Warning: the embedded engine failed.
    pub const ENGINE_FAILED: &str = "EngineFailed";
    /// Normal: the CloudControllerManager is being deleted; cluster-scoped objects were removed.
    pub const CLEANED_UP: &str = "CleanedUp";
    /// Warning: cleanup on deletion failed and will be retried.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";

    /// Every event reason.
    pub const ALL: [&str; 10] = [
        APPLIED,
        PRUNED,
        APPLY_FAILED,
        CONFIG_INVALID,
        CONFIG_VALID,
        ENGINE_STARTED,
        ENGINE_STOPPED,
        ENGINE_FAILED,
        CLEANED_UP,
        CLEANUP_FAILED,
    ];
}

/// Every condition reason, each group once.
pub fn all_condition_reasons() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = ready::ALL
        .iter()
        .chain(&config_valid::ALL)
        .chain(&available::ALL)
        .chain(&progressing::ALL)
        .chain(&degraded::ALL)
        .chain(&provider_healthy::ALL)
        .chain(&provider_healthy::MANAGER)
        .chain(&shadow_agrees::ALL)
        .chain(&announcing::ALL)
        .chain(&service_load_balancer::ALL)
        .chain(&load_balancer_state::ALL)
        .chain(&ip_pool::ALL)
        .copied()
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_camel_case_word(s: &str) -> bool {
        s.chars().next().is_some_and(|c| c.is_ascii_uppercase()) && s.chars().all(|c| c.is_ascii_alphanumeric())
    }

    #[test]
    fn every_reason_is_documented_in_troubleshooting() {
        let doc = include_str!("../../docs/troubleshooting.md");
        let all = all_condition_reasons().into_iter().chain(events::ALL);
        let missing: Vec<&str> = all.filter(|r| !doc.contains(&format!("`{r}`"))).collect();
        assert!(missing.is_empty(), "docs/troubleshooting.md does not explain these reasons: {missing:?}");
    }

    #[test]
    fn the_operator_readme_documents_every_reason_the_operator_writes() {
        let readme = include_str!("../../operator/README.md");
        let all = config_valid::ALL
            .iter()
            .chain(&available::ALL)
            .chain(&progressing::ALL)
            .chain(&degraded::ALL)
            .chain(&provider_healthy::ALL)
            .chain(&announcing::ALL)
            .chain(&events::ALL);
        for r in all {
            assert!(readme.contains(&format!("`{r}`")), "operator/README.md does not document reason {r}");
        }
    }

    #[test]
    fn every_reason_is_one_camel_case_word() {
        for r in all_condition_reasons().into_iter().chain(events::ALL) {
            assert!(is_camel_case_word(r), "{r} is not one CamelCase word");
        }
    }
}
