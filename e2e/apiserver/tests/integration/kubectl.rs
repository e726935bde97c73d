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
