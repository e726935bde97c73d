//! The announcers' metrics endpoint (`spec.announcer.metricsPort`, issue 47 item 1) on the real
//! cluster: each announcer Pod serves HTTPS on its Node's address; the genuine authenticator
//! and authorizer answer its TokenReviews and SubjectAccessReviews made with the chart's
//! announcer role: no token is 401, a ServiceAccount without `get /metrics` is 403, one with it
//! reads what that Node announces and its BGP sessions.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ccm_framework::serving::probe;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::{CCM_NS, Ctx, wait};

/// The port the scenarios give `spec.announcer.metricsPort`.
pub const METRICS_PORT: i32 = 7473;
/// The reader with `get /metrics`, and the one without.
const READER: &str = "announcer-metrics-reader";
const STRANGER: &str = "announcer-metrics-stranger";

/// A token of the ServiceAccount `name` in the announcers' namespace (created when absent).
async fn token(ctx: &Ctx, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}});
    accounts.patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&account)).await.expect("a ServiceAccount");
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(600), ..Default::default() },
        ..Default::default()
    };
    let answer = accounts.create_token_request(name, &Default::default(), &request).await.expect("a token");
    answer.status.expect("a token in the answer").token
}

/// Grants the reader `get` on `/metrics` (a ClusterRole and its binding, both `e2e-`named).
async fn grant_reader(ctx: &Ctx) {
    let params = PatchParams::apply("e2e").force();
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": format!("e2e-{READER}")},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]});
    let roles: Api<ClusterRole> = Api::all(ctx.client.clone());
    roles.patch(&format!("e2e-{READER}"), &params, &Patch::Apply(&role)).await.expect("the reader's ClusterRole");
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": format!("e2e-{READER}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": format!("e2e-{READER}")},
        "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": CCM_NS}]});
    let bindings: Api<ClusterRoleBinding> = Api::all(ctx.client.clone());
    bindings.patch(&format!("e2e-{READER}"), &params, &Patch::Apply(&binding)).await.expect("the reader's binding");
}

/// Removes what [`grant_reader`] and [`token`] made.
async fn clean_up(ctx: &Ctx) {
    let dp = DeleteParams::default();
    let _ = Api::<ClusterRoleBinding>::all(ctx.client.clone()).delete(&format!("e2e-{READER}"), &dp).await;
    let _ = Api::<ClusterRole>::all(ctx.client.clone()).delete(&format!("e2e-{READER}"), &dp).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), CCM_NS);
    for name in [READER, STRANGER] {
        let _ = accounts.delete(name, &dp).await;
    }
}

/// Scrapes every announcer Pod's endpoint until each shows every line `wanted` gives for its
/// Node; checks the refusals on the way. One line per Node: what it showed.
pub async fn scrape_every_announcer(ctx: &Ctx, wanted: impl Fn(&str) -> Vec<String>) -> Vec<String> {
    grant_reader(ctx).await;
    let reader = token(ctx, READER).await;
    let stranger = token(ctx, STRANGER).await;
    let mut seen = Vec::new();
    for (node, pod) in crate::bgp::announcer_pods(ctx).await {
        let ip: IpAddr = pod.status.and_then(|s| s.pod_ip).and_then(|ip| ip.parse().ok()).expect("the Pod's address");
        let addr = SocketAddr::new(ip, METRICS_PORT as u16);
        let get = |token: Option<String>| async move {
            probe::get(addr, "/metrics", token.as_deref(), Duration::from_secs(5)).await
        };
        let anonymous =
            wait(&format!("{node}'s announcer endpoint answering"), Duration::from_secs(60), || get(None)).await;
        assert_eq!(anonymous.status, 401, "{node}: no token, no metrics: {anonymous:?}");
        // The authorizer's answer comes after the reader's binding reaches its cache.
        let refused = get(Some(stranger.clone())).await.expect("an answer");
        assert_eq!(refused.status, 403, "{node}: a ServiceAccount without get /metrics: {refused:?}");
        let lines = wanted(&node);
        let body = wait(&format!("{node}'s announcer metrics showing {lines:?}"), Duration::from_secs(60), || async {
            let answer = get(Some(reader.clone())).await?;
            (answer.status == 200 && lines.iter().all(|l| answer.body.contains(l.as_str()))).then_some(answer.body)
        })
        .await;
        let announcer: Vec<&str> = body.lines().filter(|l| l.starts_with("ccm_announcer_")).collect();
        seen.push(format!("{node}: {}", announcer.join("; ")));
    }
    clean_up(ctx).await;
    seen
}
