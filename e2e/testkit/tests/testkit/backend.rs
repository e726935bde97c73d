//! The backend harness itself: both backends serve the same client API, the genuine one
//! enforces RBAC for ServiceAccount tokens, and its audit log reads as the request log.

use k8s_openapi::api::core::v1::{ConfigMap, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::Client;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use testkit::{TestCluster, config_map, eventually, node};

testkit::backend_tests! {
    /// A create shows in the request log with its verb, resource, name and status.
    async fn requests_are_logged_with_verb_resource_and_status(backend) {
        let cluster = TestCluster::start(backend).await.expect("cluster");
        let ns = cluster.fresh_namespace("log").await.expect("namespace");
        let cms: Api<ConfigMap> = Api::namespaced(cluster.client(), &ns);
        let mark = cluster.request_log().mark();
        cms.create(&PostParams { field_manager: Some("probe".into()), ..Default::default() }, &config_map("a", &[("k", "v")]))
            .await
            .expect("create");
        let records = eventually("the create in the log", || async {
            let r = cluster.request_log().since(mark);
            r.iter().any(|r| r.verb == "create").then_some(r)
        })
        .await;
        let create = records.iter().find(|r| r.verb == "create").expect("a create");
        assert_eq!(create.resource.as_deref(), Some("configmaps"));
        assert_eq!(create.namespace.as_deref(), Some(ns.as_str()));
        assert_eq!(create.field_manager.as_deref(), Some("probe"), "{create:?}");
        assert_eq!(create.status, 201);
        assert!(create.is_write());
    }

    /// Objects an earlier test left are gone when the next test starts (cluster-scoped too).
    async fn each_test_starts_without_earlier_tests_objects(backend) {
        let first = TestCluster::start(backend).await.expect("cluster");
        let nodes: Api<Node> = Api::all(first.client());
        nodes.create(&PostParams::default(), &node("left-behind")).await.expect("create");
        if !first.is_genuine() {
            // Every local test gets a server of its own.
            drop(first);
            let second = TestCluster::start(backend).await.expect("cluster");
            assert!(Api::<Node>::all(second.client()).list(&ListParams::default()).await.expect("list").items.is_empty());
            return;
        }
        drop(first);
        let second = TestCluster::start(backend).await.expect("cluster");
        let left = Api::<Node>::all(second.client()).list(&ListParams::default()).await.expect("list");
        assert!(left.items.is_empty(), "left: {:?}", left.items.iter().map(|n| n.metadata.name.clone()).collect::<Vec<_>>());
        assert!(Api::<k8s_openapi::api::core::v1::Service>::namespaced(second.client(), "default")
            .get_opt("kubernetes").await.expect("get").is_some(), "the API server's own objects stay");
    }

    /// A ServiceAccount's token is authenticated and authorized by RBAC on the genuine backend
    /// (the local server has no authentication: the same calls succeed there).
    async fn service_account_tokens_are_subject_to_rbac(backend) {
        let cluster = TestCluster::start(backend).await.expect("cluster");
        let ns = cluster.fresh_namespace("rbac").await.expect("namespace");
        let sa = ServiceAccount { metadata: ObjectMeta { name: Some("reader".into()), ..Default::default() }, ..Default::default() };
        Api::<ServiceAccount>::namespaced(cluster.client(), &ns).create(&PostParams::default(), &sa).await.expect("sa");
        let (config, path) = cluster.service_account(&ns, "reader").await.expect("token");
        assert!(path.exists());
        let as_sa = Client::try_from(config).expect("client");
        let denied = Api::<Node>::all(as_sa.clone()).list(&ListParams::default()).await;
        if cluster.is_genuine() {
            match denied {
                Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
                other => panic!("expected 403, got {other:?}"),
            }
        } else {
            assert!(denied.is_ok());
        }
        let role = ClusterRole {
            metadata: ObjectMeta { name: Some(format!("{ns}-nodes")), ..Default::default() },
            rules: Some(vec![PolicyRule { api_groups: Some(vec!["".into()]), resources: Some(vec!["nodes".into()]), verbs: vec!["list".into()], ..Default::default() }]),
            ..Default::default()
        };
        Api::<ClusterRole>::all(cluster.client()).create(&PostParams::default(), &role).await.expect("role");
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta { name: Some(format!("{ns}-nodes")), ..Default::default() },
            role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "ClusterRole".into(), name: format!("{ns}-nodes") },
            subjects: Some(vec![Subject { kind: "ServiceAccount".into(), name: "reader".into(), namespace: Some(ns.clone()), ..Default::default() }]),
        };
        Api::<ClusterRoleBinding>::all(cluster.client()).create(&PostParams::default(), &binding).await.expect("binding");
        eventually("the binding to take effect", || async {
            Api::<Node>::all(as_sa.clone()).list(&ListParams::default()).await.ok()
        })
        .await;
        if cluster.is_genuine() {
            let user = format!("system:serviceaccount:{ns}:reader");
            let seen = cluster.request_log().count(|r| r.user.as_deref() == Some(user.as_str()) && r.resource.as_deref() == Some("nodes"));
            assert!(seen >= 2, "the audit log names the ServiceAccount ({seen} records)");
        }
    }

    /// Injected faults answer on both backends (through the proxy on the genuine one), only for
    /// the matching path and verb, and clearing them restores service; closing watches ends them.
    async fn injected_faults_hit_only_matching_requests_until_cleared(backend) {
        let cluster = TestCluster::start_with_faults(backend).await.expect("cluster");
        let nodes: Api<Node> = Api::all(cluster.client());
        nodes.create(&PostParams::default(), &node("stuck")).await.expect("create");
        cluster.faults().add_rule(testkit::FaultRule {
            path_prefix: Some("/api/v1/nodes/stuck".into()),
            verbs: vec!["delete".into()],
            error_rate: 1.0,
            status: 500,
            ..Default::default()
        });
        match nodes.delete("stuck", &Default::default()).await {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 500),
            other => panic!("expected the injected 500, got {other:?}"),
        }
        assert!(nodes.get_opt("stuck").await.expect("a get is not faulted").is_some());
        cluster.faults().clear();
        nodes.delete("stuck", &Default::default()).await.expect("delete after clear");

        use futures::StreamExt;
        // From a list's resourceVersion, as controllers watch (a genuine server with etcd 3.5.1
        // refuses `resourceVersion=0` watches: no RequestWatchProgress).
        let version = nodes.list_metadata(&Default::default()).await.expect("list").metadata.resource_version.unwrap_or_default();
        let mut stream = nodes.watch(&kube::api::WatchParams::default().timeout(60), &version).await.expect("watch").boxed();
        eventually("the watch to be counted", || async { cluster.faults().open_watches() >= 1 }).await;
        cluster.faults().close_watches();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while stream.next().await.is_some() {}
        })
        .await;
        assert!(ended.is_ok(), "the watch ended when watches were closed");
    }
}
