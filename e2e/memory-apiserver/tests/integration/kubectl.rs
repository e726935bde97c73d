//! The real kubectl against the server: apply --server-side, get (table and JSON), wait, delete.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::common::*;

fn kubectl_path() -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join("kubectl")).find(|p| p.is_file())
}

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    async fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(&self.cache).args(args);
        cmd.env_remove("KUBECONFIG");
        tokio::task::spawn_blocking(move || cmd.output().expect("kubectl runs")).await.unwrap()
    }

    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

const MANIFEST: &str = r#"apiVersion: v1
kind: Node
metadata:
  name: kubectl-node
  labels:
    example.com/role: worker
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: default
data:
  mode: fast
"#;

#[tokio::test]
async fn kubectl_applies_gets_waits_and_deletes() {
    let Some(bin) = kubectl_path() else {
        println!("SKIPPED kubectl_applies_gets_waits_and_deletes: kubectl is not on PATH");
        return;
    };
    let s = server().await;
    let dir = s.kubeconfig_path().parent().unwrap().to_path_buf();
    let manifest = dir.join("manifest.yaml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let k = Kubectl { bin, kubeconfig: s.kubeconfig_path().to_path_buf(), cache: dir.join("cache") };

    let out = k.ok(&["apply", "--server-side", "-f", manifest.to_str().unwrap()]).await;
    assert!(out.contains("node/kubectl-node serverside-applied"), "{out}");
    assert!(out.contains("configmap/settings serverside-applied"), "{out}");
    let applies = s.request_log().filter(|r| r.verb == "patch" && r.field_manager.as_deref() == Some("kubectl"));
    assert_eq!(applies.len(), 2, "both objects applied with field manager kubectl");
    // Applying again is a no-op.
    let out = k.ok(&["apply", "--server-side", "-f", manifest.to_str().unwrap()]).await;
    assert!(out.contains("serverside-applied"), "{out}");

    let table = k.ok(&["get", "nodes"]).await;
    assert!(table.lines().next().unwrap().contains("NAME"), "{table}");
    assert!(table.contains("kubectl-node"), "{table}");

    let json: Value = serde_json::from_str(&k.ok(&["get", "node", "kubectl-node", "-o", "json"]).await).unwrap();
    assert_eq!(json["metadata"]["labels"]["example.com/role"], "worker");
    let cm: Value =
        serde_json::from_str(&k.ok(&["get", "configmap", "settings", "-n", "default", "-o", "json"]).await).unwrap();
    assert_eq!(cm["data"]["mode"], "fast");
    let cms = k.ok(&["get", "cm", "-A"]).await;
    assert!(cms.contains("settings"), "{cms}");

    // kubectl wait watches until the condition appears.
    let waiter = {
        let k = Kubectl { bin: k.bin.clone(), kubeconfig: k.kubeconfig.clone(), cache: k.cache.clone() };
        tokio::spawn(
            async move { k.run(&["wait", "--for=condition=Ready", "node/kubectl-node", "--timeout=20s"]).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let nodes: Api<Node> = Api::all(s.client());
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}]}});
    nodes.patch_status("kubectl-node", &PatchParams::default(), &Patch::Merge(ready)).await.unwrap();
    let out = waiter.await.unwrap();
    assert!(out.status.success(), "kubectl wait failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    let table = k.ok(&["get", "nodes"]).await;
    assert!(table.contains("Ready"), "{table}");

    let out = k.ok(&["delete", "node", "kubectl-node"]).await;
    assert!(out.contains("deleted"), "{out}");
    let gone = k.run(&["get", "node", "kubectl-node"]).await;
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("NotFound"), "{}", String::from_utf8_lossy(&gone.stderr));
}

#[tokio::test]
async fn kubectl_works_with_custom_resources() {
    let Some(bin) = kubectl_path() else {
        println!("SKIPPED kubectl_works_with_custom_resources: kubectl is not on PATH");
        return;
    };
    let s = server().await;
    let dir = s.kubeconfig_path().parent().unwrap().to_path_buf();
    let k = Kubectl { bin, kubeconfig: s.kubeconfig_path().to_path_buf(), cache: dir.join("cache") };
    let crd = dir.join("crd.json");
    std::fs::write(&crd, serde_json::to_vec(&crate::crd::widget_crd("Namespaced")).unwrap()).unwrap();
    k.ok(&["apply", "--server-side", "-f", crd.to_str().unwrap()]).await;
    k.ok(&["wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=10s"]).await;
    let w = dir.join("w.yaml");
    std::fs::write(&w, "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 4\n").unwrap();
    k.ok(&["apply", "--server-side", "-f", w.to_str().unwrap()]).await;
    let table = k.ok(&["get", "widgets"]).await;
    assert!(table.contains("SIZE") && table.contains("w1") && table.contains('4'), "{table}");
    let short = k.ok(&["get", "wd", "w1", "-o", "jsonpath={.spec.size}"]).await;
    assert_eq!(short.trim(), "4");
    k.ok(&["delete", "-f", w.to_str().unwrap()]).await;
}

const WIDE_MANIFEST: &str = r#"apiVersion: v1
kind: Node
metadata:
  name: wide-node
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - {name: web, image: example.com/web:1}
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
  namespace: default
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - {name: agent, image: example.com/agent:1}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: leader
  namespace: default
spec:
  holderIdentity: me
---
apiVersion: v1
kind: Event
metadata:
  name: web.1
  namespace: default
involvedObject: {kind: Deployment, name: web, namespace: default}
reason: Synced
message: synced
type: Normal
"#;

/// The header line of `kubectl get <kind> -o wide` on one server.
async fn wide_headers(cluster: &testkit::TestCluster, dir: &Path) -> Vec<String> {
    let kubectl = Kubectl {
        bin: kubectl_path().expect("kubectl"),
        kubeconfig: cluster.kubeconfig_path(),
        cache: dir.join("cache"),
    };
    std::fs::create_dir_all(dir).unwrap();
    let manifest = dir.join("wide.yaml");
    std::fs::write(&manifest, WIDE_MANIFEST).unwrap();
    kubectl.ok(&["apply", "--server-side", "-f", manifest.to_str().unwrap()]).await;
    let mut headers = vec![];
    for kind in ["nodes", "deployments", "daemonsets", "leases", "events"] {
        let out = kubectl.ok(&["get", kind, "-n", "default", "-o", "wide"]).await;
        let header = out.lines().next().unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ");
        headers.push(format!("{kind}: {header}"));
    }
    headers
}

/// `kubectl get -o wide` prints the same columns for Nodes, Deployments, DaemonSets, Leases and
/// Events from the local server as from a genuine kube-apiserver.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_tables_have_the_genuine_servers_columns() {
    if kubectl_path().is_none() {
        println!("SKIPPED kubectl_tables_have_the_genuine_servers_columns: kubectl is not on PATH");
        return;
    }
    let local = testkit::TestCluster::start(testkit::Backend::Local).await.unwrap();
    let dir = std::env::temp_dir().join(format!("ccm-kubectl-wide-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let local_headers = wide_headers(&local, &dir.join("local")).await;
    assert!(
        local_headers.iter().any(|h| h.starts_with("nodes: NAME STATUS ROLES AGE VERSION INTERNAL-IP")),
        "{local_headers:?}"
    );
    assert!(local_headers.iter().any(|h| h == "leases: NAME HOLDER AGE"), "{local_headers:?}");
    if testkit::Backend::genuine_available() {
        let genuine = testkit::TestCluster::start(testkit::Backend::Genuine).await.unwrap();
        let genuine_headers = wide_headers(&genuine, &dir.join("genuine")).await;
        assert_eq!(local_headers, genuine_headers);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const EXPLAINED_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.explain.ccm.rs
spec:
  group: explain.ccm.rs
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget, shortNames: [gd]}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: What the gadget should be.
            properties:
              mode:
                type: string
                description: How the gadget runs.
"#;

/// `kubectl explain` reads a custom resource's schema from the server's OpenAPI v3 documents,
/// on the local server as on a genuine one.
mod kubectl_explain_reads_custom_resource_schemas {
    use super::*;

    async fn explain(cluster: testkit::TestCluster) {
        if kubectl_path().is_none() {
            println!("SKIPPED kubectl_explain: kubectl is not on PATH");
            return;
        }
        let dir =
            std::env::temp_dir().join(format!("ccm-kubectl-explain-{}-{:?}", std::process::id(), cluster.backend()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubectl =
            Kubectl { bin: kubectl_path().unwrap(), kubeconfig: cluster.kubeconfig_path(), cache: dir.join("cache") };
        let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            serde_yaml::from_str(EXPLAINED_CRD).unwrap();
        cluster.install_crd(&crd).await.unwrap();
        // A genuine server publishes a new CRD's OpenAPI a moment after it is established.
        let mut tries = 0;
        let out = loop {
            let out = kubectl.run(&["explain", "gadgets.spec"]).await;
            tries += 1;
            if out.status.success() || tries == 50 {
                break String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(out.contains("What the gadget should be."), "{out}");
        assert!(out.contains("mode") && out.contains("How the gadget runs."), "{out}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn local() {
        explain(testkit::TestCluster::start(testkit::Backend::Local).await.unwrap()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn genuine() {
        if testkit::Backend::genuine_available() {
            explain(testkit::TestCluster::start(testkit::Backend::Genuine).await.unwrap()).await;
        }
    }
}
