//! What a Pod of the operator's making can do with its own identity, on the real cluster
//! (issue 45): an announcer Pod's token, bound to the Pod as the kubelet's projected token is,
//! writes only its own Node's announcer Lease and records; and a host-network manager listens on its Pod's
//! address only, not on every address of the Node.

use std::process::Command;

use crds::announcement::ServiceAnnouncement;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::multinode::measured;
use crate::{CCM_NAME, CCM_NS, Ctx};

/// The manager's secure port (health and metrics).
const MANAGER_PORT: u16 = 10258;

/// A client that authenticates with `token` alone (no client certificate).
async fn client_with_token(ctx: &Ctx, token: String) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(ctx.cluster.kubeconfig()).expect("the admin kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("the admin kubeconfig");
    config.auth_info = kube::config::AuthInfo { token: Some(token.into()), ..Default::default() };
    Client::try_from(config).expect("a client")
}

/// A token of the announcer's ServiceAccount bound to the announcer Pod `pod` (uid `uid`), as
/// the kubelet's projected token is: it names the Pod's Node.
async fn pod_bound_token(ctx: &Ctx, pod: &str, uid: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), CCM_NS);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    };
    let account = format!("ccm-{CCM_NAME}-announcer");
    let answer = sas.create_token_request(&account, &Default::default(), &request).await.expect("a token");
    answer.status.expect("a token in the answer").token
}

/// A Lease as an announcer writes it (`ccm.rs/announcer=l2`), held by `holder`.
fn announcer_lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": CCM_NS, "labels": {"ccm.rs/announcer": "l2"}},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 6}}))
    .expect("a Lease")
}

/// Issue 45, on the real cluster: with the Pod-bound token of the announcer on one Node, a
/// dry-run write (patch, or create when absent) of its own Node's Lease is admitted, while the
/// same write of another Node's
/// announcer Lease, and of `kube-scheduler`'s and `kube-controller-manager`'s Leases, is
/// refused; and the manager on the host network listens on its Pod's (the Node's) address, not
/// on `0.0.0.0`.
pub async fn an_announcer_pods_token_writes_only_its_nodes_lease_and_the_manager_listens_on_its_pod_address(
    ctx: std::sync::Arc<Ctx>,
) {
    let (node, pod) = crate::bgp::announcer_pods(&ctx).await.into_iter().next().expect("an announcer Pod");
    let other = ctx.cluster.node_names().into_iter().find(|n| *n != node).expect("another Node");
    let token = pod_bound_token(&ctx, &pod.name_any(), &pod.uid().unwrap_or_default()).await;
    let announcer = client_with_token(&ctx, token).await;
    let leases: Api<Lease> = Api::namespaced(announcer, CCM_NS);
    // The announcer's role lists, watches, creates, patches and deletes Leases (no get).
    let existing: Vec<String> =
        leases.list(&Default::default()).await.expect("listing Leases").items.iter().map(|l| l.name_any()).collect();
    let write = |name: String| {
        let leases = leases.clone();
        let lease = announcer_lease(&name, &node);
        let exists = existing.contains(&name);
        async move {
            if exists {
                let patch = serde_json::to_value(&lease).expect("a Lease as JSON");
                let params = PatchParams { dry_run: true, ..Default::default() };
                leases.patch(&name, &params, &Patch::Merge(&patch)).await.map(drop)
            } else {
                leases.create(&PostParams { dry_run: true, ..Default::default() }, &lease).await.map(drop)
            }
        }
    };

    let own = format!("l2-announcer-{node}");
    write(own.clone()).await.unwrap_or_else(|e| panic!("{node}'s announcer may write its own Lease {own}: {e}"));
    let mut refused = Vec::new();
    for name in [format!("l2-announcer-{other}"), "kube-scheduler".into(), "kube-controller-manager".into()] {
        match write(name.clone()).await {
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => refused.push(name),
            outcome => panic!("{node}'s announcer writing the Lease {name} is refused: {outcome:?}"),
        }
    }
    // Its ServiceAnnouncement records likewise: its own node's admitted, another node's refused.
    let records: Api<ServiceAnnouncement> = Api::namespaced(leases.clone().into_client(), CCM_NS);
    let record = |on: &str| {
        let name = format!("{on}.{}.probe", crate::APP_NS);
        serde_json::from_value::<ServiceAnnouncement>(json!({"apiVersion": "ccm.rs/v1alpha1", "kind": "ServiceAnnouncement",
            "metadata": {"name": name, "namespace": CCM_NS, "labels": {"ccm.rs/announcer": "l2"}},
            "spec": {"node": on, "service": {"namespace": crate::APP_NS, "name": "probe"}, "since": "2026-01-01T00:00:00.000000Z",
                     "addresses": [{"address": "127.0.0.250", "protocol": "ARP", "since": "2026-01-01T00:00:00.000000Z"}]}}))
        .expect("a record")
    };
    let dry = PostParams { dry_run: true, ..Default::default() };
    records
        .create(&dry, &record(&node))
        .await
        .unwrap_or_else(|e| panic!("{node}'s announcer may write its own record: {e}"));
    match records.create(&dry, &record(&other)).await {
        Err(kube::Error::Api(status)) if status.code == 403 || status.code == 422 => {
            refused.push(format!("a record naming {other}"))
        }
        outcome => panic!("{node}'s announcer writing a record naming {other} is refused: {outcome:?}"),
    }
    measured(format!(
        "{node}'s announcer Pod token: its own Lease {own} and its own record admitted (dry run); {} refused",
        refused.join(", ")
    ));

    let out = Command::new("ss").args(["-Hltn", &format!("sport = :{MANAGER_PORT}")]).output().expect("ss");
    let listening = String::from_utf8_lossy(&out.stdout).into_owned();
    let host_ip = ctx.cluster.node(&ctx.cluster.node_name).map(|p| p.ip).expect("the host Node's address");
    assert!(listening.contains(&format!("{host_ip}:{MANAGER_PORT}")), "the manager listens on {host_ip}: {listening}");
    assert!(
        !listening.contains(&format!("0.0.0.0:{MANAGER_PORT}")) && !listening.contains(&format!("*:{MANAGER_PORT}")),
        "not on every address: {listening}"
    );
}
