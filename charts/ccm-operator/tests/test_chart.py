"""Chart tests with real Helm (helm-sdkpy): lint, schema, rendering and install.

Run through `run.py` (which `cargo test -p e2e --test e2e chart::` calls with a local API server).
Tests marked as needing a cluster read the kubeconfig from CHART_TEST_KUBECONFIG.
"""

from __future__ import annotations

import json
import os
import re
import time
import unittest
import uuid
from typing import Any

import yaml

import helmlib
from helmlib import CHART, Cluster, find, one

IN_CI = os.environ.get("CI") == "true"
KUBECONFIG = os.environ.get("CHART_TEST_KUBECONFIG")
CRD_FILE = CHART / "crds" / "cloudcontrollermanagers.ccm.rs.yaml"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def needs_cluster(cls):
    """Skip a test class without a cluster, except in CI, where that is a failure."""
    if KUBECONFIG or IN_CI:
        return cls
    return unittest.skip("CHART_TEST_KUBECONFIG is not set: no API server to install into")(cls)


def crd_name() -> str:
    return yaml.safe_load(CRD_FILE.read_text())["metadata"]["name"]


def values(**overrides: Any) -> dict[str, Any]:
    """Default values with dotted-path overrides, e.g. values(**{"embedded.enabled": True})."""
    out: dict[str, Any] = {}
    for path, value in overrides.items():
        node = out
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def container(objects, name="operator") -> dict[str, Any]:
    deployment = one(objects, "Deployment")
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def arg(objects, flag: str) -> str | None:
    """The value of `--flag=value` in the operator's arguments."""
    for a in container(objects)["args"]:
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def operator_rules(objects) -> list[dict[str, Any]]:
    """Rules of the operator's ClusterRole: the one its ClusterRoleBinding names."""
    sa = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    binding = next(b for b in find(objects, "ClusterRoleBinding")
                   if any(s["name"] == sa for s in b["subjects"]) and "-embedded-" not in b["metadata"]["name"])
    return one(objects, "ClusterRole", binding["roleRef"]["name"])["rules"]


def namespace_rules(objects, namespace: str) -> list[dict[str, Any]]:
    """Rules of the operator's Role in `namespace` (one of cloudConfig.namespaces)."""
    sa = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    out = []
    for b in find(objects, "RoleBinding"):
        if b["metadata"].get("namespace") != namespace or b["roleRef"]["kind"] != "Role":
            continue
        if any(s["name"] == sa for s in b["subjects"]) and not b["metadata"]["name"].endswith("-leader-election"):
            role = next(r for r in find(objects, "Role", b["roleRef"]["name"]) if r["metadata"]["namespace"] == namespace)
            out.extend(role["rules"])
    return out


def leader_role(objects, kind="Role") -> dict[str, Any]:
    found = [o for o in find(objects, kind) if o["metadata"]["name"].endswith("-leader-election")]
    assert len(found) == 1, f"expected one leader-election {kind}, found {len(found)}"
    return found[0]


def rules_for(rules, group: str, resource: str) -> list[dict[str, Any]]:
    return [r for r in rules if group in r.get("apiGroups", []) and resource in r.get("resources", [])]


def verbs_for(rules, group: str, resource: str, name: str | None = None) -> set[str]:
    """Verbs `rules` allow on `group/resource` (on object `name`, or on any object)."""
    out: set[str] = set()
    for r in rules_for(rules, group, resource):
        names = r.get("resourceNames")
        if names and (name is None or name not in names):
            continue
        out |= set(r["verbs"])
    return out


RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in `pod` (a PodSpec) the `restricted` Pod Security Standard (which includes
    `baseline`) forbids, one line each; empty means a namespace enforcing `restricted` admits it."""
    out = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(f"{field}=true")
    for v in pod.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            out.append(f"volume {v['name']}: type {sorted(kinds)}")
    psc = pod.get("securityContext", {})
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser=0")
    if psc.get("sysctls"):
        out.append("pod sysctls")
    pod_seccomp = psc.get("seccompProfile", {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        out.append(f"pod seccompProfile {pod_seccomp}")
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        name, sc = c["name"], c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation is not false")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
            out.append(f"{name}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser=0")
        if sc.get("seccompProfile", {}).get("type", pod_seccomp) not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile is not RuntimeDefault or Localhost")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount")
        if sc.get("windowsOptions", {}).get("hostProcess"):
            out.append(f"{name}: hostProcess")
    return out


class Static(unittest.TestCase):
    """Checks on the chart's files that need no Helm."""

    def schema(self) -> dict[str, Any]:
        import json

        return json.loads((CHART / "values.schema.json").read_text())

    def test_every_value_is_in_the_schema_and_every_schema_key_has_a_default(self):
        def walk(vals, schema, path):
            props = schema.get("properties")
            if props is None:  # a free-form Kubernetes object or map: nothing to match
                return
            self.assertIs(schema.get("additionalProperties"), False, f"{path or '<root>'}: unknown keys must fail")
            self.assertIsInstance(vals, dict, path)
            self.assertEqual(sorted(vals), sorted(props), f"values.yaml and schema differ at {path or '<root>'}")
            for key, sub in props.items():
                self.assertTrue(sub.get("description"), f"schema {path}{key} has no description")
                walk(vals[key], sub, f"{path}{key}.")

        walk(helmlib.chart_values(), self.schema(), "")

    def test_every_leaf_value_has_a_comment_in_values_yaml(self):
        schema = self.schema()
        lines = (CHART / "values.yaml").read_text().splitlines()
        stack: list[tuple[int, str]] = []
        undocumented = []
        for i, line in enumerate(lines):
            m = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
            if not m:
                continue
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(2)))
            node, inside_free_form = schema, False
            for _, key in stack:
                if "properties" not in node:
                    inside_free_form = True  # e.g. resources.requests: a Kubernetes object's insides
                    break
                node = node["properties"].get(key, {})
            if inside_free_form or "properties" in node:  # parents: their children carry the comments
                continue
            previous = lines[i - 1].strip() if i else ""
            if not previous.startswith("#"):
                undocumented.append(".".join(k for _, k in stack))
        self.assertEqual(undocumented, [], "values without a comment right above them")

    def test_every_rbac_rule_says_why(self):
        for path in sorted((CHART / "templates").glob("*.yaml")):
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                if line.strip().startswith("- apiGroups:"):
                    self.assertTrue(lines[i - 1].strip().startswith("#"), f"{path.name}:{i + 1}: rule without a comment")

    def test_ci_overlays_exist(self):
        self.assertGreaterEqual(len(helmlib.CI_VALUES), 3, "charts/ccm-operator/ci/ should hold values overlays")


class Lint(unittest.TestCase):
    """`helm lint`, which also validates the values against values.schema.json."""

    def test_lint_passes_with_default_values(self):
        self.assertEqual(helmlib.lint(), [])

    def test_lint_passes_with_each_ci_overlay(self):
        defaults = helmlib.chart_values()
        for path in helmlib.CI_VALUES:
            with self.subTest(overlay=path.name):
                self.assertEqual(helmlib.lint(helmlib.merge(defaults, helmlib.load_yaml(path))), [])

    def test_schema_rejects_bad_values(self):
        defaults = helmlib.chart_values()
        bad = {
            "negative replicas": {"replicas": -1},
            "zero replicas": {"replicas": 0},
            "replicas as a string": {"replicas": "2"},
            "unknown top-level key": {"replica": 2},
            "unknown nested key": {"image": {"tagg": "1.0"}},
            "unknown deep key": {"manager": {"rbac": {"clusterRoleNmae": "x"}}},
            "boolean as a string": {"embedded": {"enabled": "yes"}},
            "unknown pull policy": {"image": {"pullPolicy": "Sometimes"}},
            "port out of range": {"metrics": {"port": 70000}},
            "malformed duration": {"serviceMonitor": {"interval": "fast"}},
            "malformed digest": {"image": {"digest": "latest"}},
            "empty manager role name": {"manager": {"rbac": {"clusterRoleName": ""}}},
            "a quote in the BIRD image (CEL)": {"announcer": {"birdImage": "x' || true || '"}},
            "a resource maximum that is no quantity": {"manager": {"maxContainerResources": {"memory": "lots"}}},
            "a reserved Lease name that is no name (CEL)": {"manager": {"reservedLeaseNames": ["x' || true"]}},
            "a star inside a reserved Lease name": {"manager": {"reservedLeaseNames": ["kube*x"]}},
            "an announcer namespace that is no name": {"announcer": {"namespaces": ["Kube System"]}},
            "the digest rule as a string": {"admissionPolicy": {"requireDigest": "yes"}},
        }
        for case, overlay in bad.items():
            with self.subTest(case=case):
                errors = helmlib.lint(helmlib.merge(defaults, overlay))
                self.assertIn("values.yaml", [e.get("Path") for e in errors], f"{case} was accepted")


@needs_cluster
class Render(unittest.TestCase):
    """What the templates produce, rendered by Helm against the test API server."""

    @classmethod
    def setUpClass(cls):
        if not KUBECONFIG:
            raise AssertionError("CI=true but CHART_TEST_KUBECONFIG is not set")
        cls.cluster = Cluster(KUBECONFIG)
        cls.cluster.install_servicemonitor_crd()

    def render(self, vals=None):
        # A fresh release name each time, so cluster-scoped names never collide between tests.
        return self.cluster.render(vals, release=f"r{uuid.uuid4().hex[:8]}")

    def render_named(self, vals=None):
        return self.cluster.render(vals, release="ccm-operator")

    def test_default_install_renders_only_the_essentials(self):
        objects = self.render_named()
        kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
        self.assertEqual(
            kinds,
            [
                "ClusterRole/ccm-manager",
                "ClusterRole/ccm-manager-namespace",
                "ClusterRole/ccm-manager-shadow",
                "ClusterRole/ccm-manager-upstream",
                "ClusterRole/ccm-node-manager",
                "ClusterRole/ccm-operator",
                "ClusterRole/ccm-operator-metrics-reader",
                "ClusterRoleBinding/ccm-operator",
                "Deployment/ccm-operator",
                "Role/ccm-operator-leader-election",
                "Role/ccm-operator-namespace",
                "RoleBinding/ccm-operator-leader-election",
                "RoleBinding/ccm-operator-namespace",
                "Service/ccm-operator-metrics",
                "ServiceAccount/ccm-operator",
                "ValidatingAdmissionPolicy/ccm-operator-manager-bindings",
                "ValidatingAdmissionPolicy/ccm-operator-manager-labels",
                "ValidatingAdmissionPolicy/ccm-operator-manager-roles",
                "ValidatingAdmissionPolicy/ccm-operator-manager-workloads",
                "ValidatingAdmissionPolicy/ccm-operator-operator-leases",
                "ValidatingAdmissionPolicy/ccm-operator-owned-objects",
                "ValidatingAdmissionPolicyBinding/ccm-operator-manager-bindings",
                "ValidatingAdmissionPolicyBinding/ccm-operator-manager-labels",
                "ValidatingAdmissionPolicyBinding/ccm-operator-manager-roles",
                "ValidatingAdmissionPolicyBinding/ccm-operator-manager-workloads",
                "ValidatingAdmissionPolicyBinding/ccm-operator-operator-leases",
                "ValidatingAdmissionPolicyBinding/ccm-operator-owned-objects",
            ],
        )

    def test_admission_policies_bind_only_the_operators_requests_and_can_be_turned_off(self):
        objects = self.render_named()
        policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
        self.assertEqual(len(policies), 6)
        for policy in policies:
            conditions = policy["spec"]["matchConditions"]
            self.assertEqual(len(conditions), 1)
            self.assertIn('"system:serviceaccount:ccm-render:ccm-operator"', conditions[0]["expression"])
            self.assertEqual(policy["spec"]["failurePolicy"], "Fail")
        bindings = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
        self.assertEqual(sorted(b["spec"]["policyName"] for b in bindings), sorted(p["metadata"]["name"] for p in policies))
        self.assertTrue(all(b["spec"]["validationActions"] == ["Deny"] for b in bindings))
        workloads = next(p for p in policies if p["metadata"]["name"].endswith("-manager-workloads"))
        images = next(v for v in workloads["spec"]["variables"] if v["name"] == "allowedImages")["expression"]
        self.assertEqual(json.loads(images), ["ghcr.io/ccm-rs/cloud-controller-manager:", "ghcr.io/ccm-rs/cloud-controller-manager@"])
        custom = self.render_named(values(**{"admissionPolicy.allowedImages": ["registry.example/ccm@sha256:"]}))
        workloads = next(o for o in custom if o["metadata"]["name"].endswith("-manager-workloads"))
        images = next(v for v in workloads["spec"]["variables"] if v["name"] == "allowedImages")["expression"]
        self.assertEqual(json.loads(images), ["registry.example/ccm@sha256:"])
        # With announcers, a seventh policy binds the announcers' requests.
        announcing = self.render_named(values(**{"announcer.enabled": True}))
        lease_policy = one(announcing, "ValidatingAdmissionPolicy", "ccm-operator-announcer-leases")
        self.assertIn("-announcer$", lease_policy["spec"]["matchConditions"][0]["expression"])
        one(announcing, "ValidatingAdmissionPolicyBinding", "ccm-operator-announcer-leases")
        off = self.render_named(values(**{"admissionPolicy.enabled": False}))
        self.assertFalse([o for o in off if o["kind"].startswith("ValidatingAdmissionPolicy")])

    def test_restricted_pod_security_by_default(self):
        objects = self.render()
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertEqual(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")
        sc = container(objects)["securityContext"]
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertIs(sc["runAsNonRoot"], True)
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        self.assertNotIn("add", sc["capabilities"])
        self.assertEqual(sc["seccompProfile"]["type"], "RuntimeDefault")
        self.assertFalse(pod.get("hostNetwork", False))
        self.assertIn("requests", container(objects)["resources"])
        self.assertIn("memory", container(objects)["resources"]["limits"])

    def test_every_rendered_pod_passes_the_restricted_pod_security_profile(self):
        # Every overlay and mode the chart supports: the operator never needs the host.
        overlays = {"default": {}, "embedded": values(**{"embedded.enabled": True})}
        for name in ("full-values.yaml", "ha-values.yaml", "embedded-values.yaml"):
            overlays[name] = helmlib.load_yaml(CHART / "ci" / name)
        for label, overlay in overlays.items():
            with self.subTest(overlay=label):
                objects = self.render(overlay)
                pods = [o["spec"]["template"]["spec"] for o in objects
                        if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")]
                self.assertTrue(pods)
                for pod in pods:
                    self.assertEqual(restricted_violations(pod), [])
                    # Declares what it needs and nothing more: no Service links in its
                    # environment, no host ports.
                    self.assertIs(pod.get("enableServiceLinks"), False)

    def test_restricted_check_catches_what_the_profile_forbids(self):
        pod = one(self.render(), "Deployment")["spec"]["template"]["spec"]
        self.assertEqual(restricted_violations(pod), [])
        import copy

        for what, breaker in [
            ("hostNetwork", lambda p: p.update(hostNetwork=True)),
            ("allowPrivilegeEscalation", lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")),
            ("drop ALL", lambda p: p["containers"][0]["securityContext"].pop("capabilities")),
            ("privileged", lambda p: p["containers"][0]["securityContext"].update(privileged=True)),
            ("type", lambda p: p.setdefault("volumes", []).append({"name": "h", "hostPath": {"path": "/"}})),
            ("hostPort", lambda p: p["containers"][0]["ports"][0].update(hostPort=8080)),
        ]:
            broken = copy.deepcopy(pod)
            breaker(broken)
            self.assertTrue(any(what in v for v in restricted_violations(broken)), what)

    def test_liveness_and_readiness_probe_different_endpoints_on_the_operator_port(self):
        objects = self.render()
        c = container(objects)
        live, ready = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
        # The endpoint is HTTPS with a self-signed certificate; kubelets do not verify probes.
        self.assertEqual((live["scheme"], ready["scheme"]), ("HTTPS", "HTTPS"))
        self.assertEqual(live["path"], "/livez")
        self.assertEqual(ready["path"], "/readyz")
        port = next(p for p in c["ports"] if p["name"] == "http")
        self.assertEqual((live["port"], ready["port"]), ("http", "http"))
        self.assertEqual(arg(objects, "--http-address"), f"0.0.0.0:{port['containerPort']}")
        self.assertEqual(one(objects, "Service")["spec"]["ports"][0]["targetPort"], "http")

    def test_manager_image_and_cluster_roles_are_passed_to_the_operator(self):
        objects = self.render()
        self.assertEqual(arg(objects, "--manager-image"), f"ghcr.io/ccm-rs/cloud-controller-manager:{APP_VERSION}")
        self.assertEqual(container(objects)["image"], f"ghcr.io/ccm-rs/ccm-operator:{APP_VERSION}")
        one(objects, "ClusterRole", arg(objects, "--manager-cluster-role"))
        one(objects, "ClusterRole", arg(objects, "--manager-namespace-role"))
        self.assertEqual(arg(objects, "--manager-cluster-role"), "ccm-manager")
        self.assertIsNone(arg(objects, "--namespaces"), "every namespace is served by default")

    def test_resource_author_limits_are_passed_to_the_operator(self):
        objects = self.render()
        repo = "ghcr.io/ccm-rs/cloud-controller-manager"
        self.assertEqual(arg(objects, "--allowed-images"), f"{repo}:,{repo}@", "the manager image only")
        self.assertEqual(arg(objects, "--max-replicas"), "5")
        self.assertEqual(arg(objects, "--allowed-priority-classes"), "system-cluster-critical")
        objects = self.render(
            {
                # A trailing ":" must stay a string in the rendered arguments.
                "admissionPolicy": {"allowedImages": ["mirror.example/ccm:", "mirror.example/ccm@sha256:"]},
                "manager": {"maxReplicas": 3, "allowedPriorityClasses": []},
            }
        )
        self.assertEqual(arg(objects, "--allowed-images"), "mirror.example/ccm:,mirror.example/ccm@sha256:")
        self.assertEqual(arg(objects, "--max-replicas"), "3")
        self.assertEqual(arg(objects, "--allowed-priority-classes"), "", "none allowed")

    def test_operator_defines_every_flag_the_chart_passes(self):
        # A flag the binary does not know makes it exit at start: compare with its clap flags.
        main = CHART.parent.parent / "operator" / "src" / "main.rs"
        if not main.exists():
            self.skipTest("not in the ccm-operator repository")
        source = main.read_text()
        known = set()
        for m in re.finditer(r'#\[arg\(([^\]]*?)\)\]\s*(?:pub\s+)?(\w+)\s*:', source):
            attrs, field = m.group(1), m.group(2)
            explicit = re.search(r'long\s*=\s*"([^"]+)"', attrs)
            if explicit:
                known.add(explicit.group(1))
            elif re.search(r'\blong\b', attrs):
                known.add(field.replace("_", "-"))
        self.assertIn("manager-image", known, "could not read the operator's flags")
        overlays = [None, helmlib.load_yaml(CHART / "ci" / "full-values.yaml"), values(replicas=2)]
        for overlay in overlays:
            extra = set((overlay or {}).get("extraArgs", []))
            for a in container(self.render(overlay))["args"]:
                if a in extra:
                    continue
                flag = a.split("=", 1)[0].removeprefix("--")
                self.assertIn(flag, known, f"the chart passes {a}, which ccm-operator does not define")

    def test_host_network_puts_the_operator_on_the_node_with_its_probes_and_port(self):
        default = one(self.render(), "Deployment")["spec"]["template"]["spec"]
        self.assertNotIn("hostNetwork", default)
        self.assertEqual(arg(self.render(), "--embedded-host-network"), "false")
        objects = self.render(values(**{"hostNetwork": True}))
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        self.assertIs(pod["hostNetwork"], True)
        self.assertEqual(pod["dnsPolicy"], "ClusterFirstWithHostNet")
        # The embedded engine's proxy listeners are on the Node now, so they are reachable.
        self.assertEqual(arg(objects, "--embedded-host-network"), "true")
        c = container(objects)
        port = next(p for p in c["ports"] if p["name"] == "http")
        self.assertEqual(arg(objects, "--http-address"), f"0.0.0.0:{port['containerPort']}")
        self.assertEqual(c["livenessProbe"]["httpGet"]["port"], "http")
        self.assertEqual(c["readinessProbe"]["httpGet"]["port"], "http")
        self.assertEqual(one(objects, "Service")["spec"]["ports"][0]["targetPort"], "http")
        # Only the host network: no host port beyond the one it implies, no other namespace.
        self.assertNotIn("hostPort", port)
        self.assertFalse(pod.get("hostPID", False) or pod.get("hostIPC", False))

    def test_operator_schedules_on_a_fresh_cluster_whose_nodes_are_tainted_uninitialized(self):
        # Every Node of a cluster with external cloud providers carries this taint until a
        # manager initializes it, and the operator is what starts that manager.
        uninitialized = {"key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists",
                         "effect": "NoSchedule"}
        for overlay in (None, helmlib.load_yaml(CHART / "ci" / "full-values.yaml"),
                        helmlib.load_yaml(CHART / "ci" / "ha-values.yaml")):
            pod = one(self.render(overlay), "Deployment")["spec"]["template"]["spec"]
            self.assertIn(uninitialized, pod.get("tolerations", []))
            for t in (overlay or {}).get("tolerations", []):
                self.assertIn(t, pod["tolerations"], "a user's toleration was dropped")

    def test_single_replica_elects_a_leader_so_a_deleted_pod_and_its_replacement_never_overlap(self):
        # A deleted Pod's replacement starts while the old one terminates (Recreate only
        # orders rollouts), so one replica needs the Lease too.
        objects = self.render()
        deployment = one(objects, "Deployment")
        self.assertEqual(deployment["spec"]["replicas"], 1)
        self.assertEqual(arg(objects, "--leader-elect"), "true")
        self.assertNotIn("strategy", deployment["spec"])
        self.assertEqual(find(objects, "PodDisruptionBudget"), [])
        self.assertEqual(len([r for r in find(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]), 1)
        # On the host network a rollout cannot surge (the port), so it recreates.
        objects = self.render(values(hostNetwork=True))
        self.assertEqual(one(objects, "Deployment")["spec"]["strategy"]["type"], "Recreate")

    def test_without_leader_election_a_single_replica_recreates(self):
        objects = self.render(values(**{"leaderElection.enabled": False}))
        deployment = one(objects, "Deployment")
        self.assertEqual(arg(objects, "--leader-elect"), "false")
        self.assertEqual(deployment["spec"]["strategy"]["type"], "Recreate")
        self.assertEqual([r for r in find(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")], [])

    def test_several_replicas_elect_a_leader_and_get_a_disruption_budget(self):
        objects = self.render(values(replicas=3))
        deployment = one(objects, "Deployment")
        self.assertEqual(deployment["spec"]["replicas"], 3)
        self.assertEqual(arg(objects, "--leader-elect"), "true")
        self.assertNotIn("strategy", deployment["spec"])
        pdb = one(objects, "PodDisruptionBudget")
        self.assertEqual(pdb["spec"]["maxUnavailable"], 1)
        self.assertEqual(pdb["spec"]["selector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"])
        role = leader_role(objects)
        self.assertEqual(role["metadata"]["namespace"], deployment["metadata"]["namespace"])
        self.assertEqual(arg(objects, "--leader-elect-namespace"), role["metadata"]["namespace"])
        rules = role["rules"]
        self.assertEqual(verbs_for(rules, "coordination.k8s.io", "leases", "ccm-operator"), {"create", "get", "update"})
        self.assertEqual(verbs_for(rules, "coordination.k8s.io", "leases", "another-lease"), {"create"})
        binding = leader_role(objects, "RoleBinding")
        self.assertEqual(binding["roleRef"]["name"], role["metadata"]["name"])
        self.assertEqual(binding["subjects"][0]["name"], deployment["spec"]["template"]["spec"]["serviceAccountName"])

    def test_leader_election_can_be_forced_on_for_one_replica(self):
        objects = self.render(values(**{"leaderElection.enabled": True}))
        self.assertEqual(arg(objects, "--leader-elect"), "true")
        leader_role(objects)
        self.assertEqual(find(objects, "PodDisruptionBudget"), [])

    def test_operator_role_is_least_privilege(self):
        objects = self.render()
        rules = operator_rules(objects)
        for rule in rules:
            for field in ("apiGroups", "resources", "verbs"):
                self.assertNotIn("*", rule.get(field, []), f"wildcard in {rule}")
            self.assertNotIn("escalate", rule["verbs"])
            self.assertNotIn("impersonate", rule["verbs"])
        # Its own resource, status and finalizers.
        self.assertLessEqual({"get", "list", "watch", "patch"}, verbs_for(rules, "ccm.rs", "cloudcontrollermanagers"))
        self.assertIn("patch", verbs_for(rules, "ccm.rs", "cloudcontrollermanagers/status"))
        self.assertIn("update", verbs_for(rules, "ccm.rs", "cloudcontrollermanagers/finalizers"))
        # Cluster-wide: the ClusterRoleBinding of each manager (delete is label-checked in code).
        self.assertLessEqual({"get", "list", "watch", "create", "patch", "delete"},
                             verbs_for(rules, "rbac.authorization.k8s.io", "clusterrolebindings"))
        # Nothing namespaced beyond its own resource: no Secrets, Leases or workloads anywhere but
        # in the allowed namespaces.
        for group, resource in [("", "secrets"), ("coordination.k8s.io", "leases"), ("apps", "deployments"),
                                ("apps", "daemonsets"), ("", "serviceaccounts"),
                                ("rbac.authorization.k8s.io", "rolebindings"), ("rbac.authorization.k8s.io", "roles"),
                                ("policy", "poddisruptionbudgets"), ("", "pods")]:
            with self.subTest(cluster_wide=resource):
                self.assertEqual(verbs_for(rules, group, resource), set())
        # `bind` on the cluster-wide manager ClusterRoles and the node managers', nothing else.
        bind = [r for r in rules if "bind" in r["verbs"]]
        self.assertEqual(len(bind), 1)
        self.assertEqual(bind[0]["resources"], ["clusterroles"])
        self.assertEqual(bind[0]["resourceNames"],
                         ["ccm-manager", "ccm-manager-shadow", "ccm-manager-upstream", "ccm-node-manager"])
        self.assertEqual(verbs_for(rules, "rbac.authorization.k8s.io", "clusterroles", "cluster-admin"), set())
        # Never the manager's own permissions.
        for resource in ("nodes", "nodes/status", "services", "services/status"):
            self.assertEqual(verbs_for(rules, "", resource), set(), resource)
        self.assertIn("create", verbs_for(rules, "events.k8s.io", "events"))

    def test_no_role_anywhere_reads_secrets_cluster_wide(self):
        for overlay in [None, values(**{"embedded.enabled": True}), values(replicas=2),
                        helmlib.load_yaml(CHART / "ci" / "full-values.yaml")]:
            objects = self.render(overlay)
            for role in find(objects, "ClusterRole"):
                with self.subTest(role=role["metadata"]["name"]):
                    self.assertEqual(verbs_for(role["rules"], "", "secrets"), set())

    def test_secrets_and_workloads_only_in_the_configured_namespaces(self):
        objects = self.render(values(**{"cloudConfig.namespaces": ["kube-system", "kube-public"]}))
        self.assertEqual(arg(objects, "--cloud-config-namespaces"), "kube-system,kube-public")
        for ns in ("kube-system", "kube-public"):
            with self.subTest(namespace=ns):
                rules = namespace_rules(objects, ns)
                self.assertEqual(verbs_for(rules, "", "secrets"), {"get", "list", "watch"})
                for group, resource in [("apps", "deployments"), ("apps", "daemonsets"), ("", "serviceaccounts"),
                                        ("rbac.authorization.k8s.io", "rolebindings"),
                                        ("rbac.authorization.k8s.io", "roles"), ("policy", "poddisruptionbudgets")]:
                    self.assertLessEqual({"get", "list", "watch", "create", "patch", "delete"},
                                         verbs_for(rules, group, resource), resource)
                # The manager Pods: read-only, for status and an orderly teardown.
                self.assertEqual(verbs_for(rules, "", "pods"), {"list", "watch"})
                # Lease writes only so it may grant a manager its own Lease; never create or delete.
                self.assertEqual(verbs_for(rules, "coordination.k8s.io", "leases"),
                                 {"get", "list", "watch", "update", "patch"})
                bind = [r for r in rules if "bind" in r["verbs"]]
                self.assertEqual([r["resourceNames"] for r in bind], [["ccm-manager-namespace"]])
                for rule in rules:
                    for field in ("apiGroups", "resources", "verbs"):
                        self.assertNotIn("*", rule.get(field, []))
        self.assertEqual(namespace_rules(objects, "default"), [])
        default = self.render()
        self.assertEqual(arg(default, "--cloud-config-namespaces"), "ccm-system")

    def test_operator_may_touch_only_the_crds_the_chart_ships(self):
        shipped = sorted(yaml.safe_load(p.read_text())["metadata"]["name"]
                         for p in CRD_FILE.parent.glob("*.yaml"))
        self.assertIn(crd_name(), shipped)
        self.assertIn("loadbalancerippools.ccm.rs", shipped)
        for manage in (True, False):
            with self.subTest(manage=manage):
                objects = self.render(values(**{"crds.manage": manage}))
                rules = operator_rules(objects)
                crd_rules = rules_for(rules, "apiextensions.k8s.io", "customresourcedefinitions")
                self.assertEqual(len(crd_rules), 1)
                self.assertEqual(sorted(crd_rules[0]["resourceNames"]), shipped)
                expected = {"get", "list", "watch"} | ({"patch"} if manage else set())
                self.assertEqual(set(crd_rules[0]["verbs"]), expected)
                # The operator applies its CRD only when the chart grants the patch.
                self.assertEqual(arg(objects, "--manage-crd"), "true" if manage else "false")

    def test_manager_roles_grant_what_a_cloud_controller_manager_needs(self):
        objects = self.render()
        cluster_wide = one(objects, "ClusterRole", "ccm-manager")["rules"]
        own_namespace = one(objects, "ClusterRole", "ccm-manager-namespace")["rules"]
        needed = {
            ("", "nodes"): (cluster_wide, {"get", "list", "watch", "patch", "delete"}),
            ("", "nodes/status"): (cluster_wide, {"patch"}),
            ("", "services"): (cluster_wide, {"get", "list", "watch", "patch"}),
            ("", "services/status"): (cluster_wide, {"patch"}),
            ("events.k8s.io", "events"): (cluster_wide, {"create", "patch"}),
            ("coordination.k8s.io", "leases"): (own_namespace, {"create"}),
        }
        for (group, resource), (rules, verbs) in needed.items():
            with self.subTest(resource=resource):
                self.assertLessEqual(verbs, verbs_for(rules, group, resource))
        # Reading and renewing its Lease, reading its resource and writing its status come from the
        # Role the operator makes per resource, by name (operator/src/build.rs): not from here.
        self.assertEqual(verbs_for(own_namespace, "coordination.k8s.io", "leases"), {"create"})
        self.assertEqual(verbs_for(own_namespace, "ccm.rs", "cloudcontrollermanagers"), set())
        # Leases and its own resource only in its namespace, never cluster-wide.
        self.assertEqual(verbs_for(cluster_wide, "coordination.k8s.io", "leases"), set())
        self.assertEqual(verbs_for(cluster_wide, "ccm.rs", "cloudcontrollermanagers/status"), set())
        for rules in (cluster_wide, own_namespace):
            self.assertEqual(verbs_for(rules, "", "secrets"), set(), "the manager reads its cloud-config from a volume")
            for rule in rules:
                for field in ("apiGroups", "resources", "verbs"):
                    self.assertNotIn("*", rule.get(field, []))

    def test_embedded_mode_rules_only_when_enabled(self):
        def bound_to_operator(objects):
            sa = one(objects, "ServiceAccount")["metadata"]["name"]
            return sorted(b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding")
                          if [s["name"] for s in b["subjects"]] == [sa] and b["roleRef"]["kind"] == "ClusterRole")

        objects = self.render_named()
        self.assertEqual(bound_to_operator(objects), ["ccm-operator"],
                         "Deployment-mode installs must not give the operator the manager's rights")
        objects = self.render_named(values(**{"embedded.enabled": True}))
        self.assertEqual(bound_to_operator(objects), ["ccm-manager", "ccm-operator"])
        # The namespace part only where CloudControllerManagers may run.
        namespaced = [(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in find(objects, "RoleBinding")
                      if b["roleRef"]["kind"] == "ClusterRole"]
        self.assertEqual(namespaced, [("ccm-system", "ccm-manager-namespace")])

    def test_the_operator_refuses_embedded_mode_unless_the_chart_granted_its_rights(self):
        # The operator must know: without the manager's rights an embedded engine stalls on 403s
        # after the working manager was removed. Its Pod is on the pod network, where an
        # embedded proxy data path would be unreachable.
        objects = self.render()
        self.assertEqual(arg(objects, "--embedded-enabled"), "false")
        self.assertFalse(one(objects, "Deployment")["spec"]["template"]["spec"].get("hostNetwork", False))
        self.assertEqual(arg(objects, "--embedded-host-network"), "false")
        objects = self.render(values(**{"embedded.enabled": True}))
        self.assertEqual(arg(objects, "--embedded-enabled"), "true")

    def test_announcer_roles_and_the_operators_bind_on_them_only_when_announcers_are_enabled(self):
        def bind_names(objects):
            return sorted(n for r in find(objects, "ClusterRole") + find(objects, "Role") for rule in r["rules"]
                          if rule["verbs"] == ["bind"] for n in rule.get("resourceNames", []))

        objects = self.render_named()
        self.assertEqual(arg(objects, "--allow-announcers"), "false")
        self.assertNotIn("ccm-announcer", [r["metadata"]["name"] for r in find(objects, "ClusterRole")])
        self.assertNotIn("ccm-announcer", bind_names(objects))
        self.assertIsNone(arg(objects, "--bird-image"))
        objects = self.render_named(values(**{"announcer.enabled": True, "announcer.birdImage": "example.test/bird:2"}))
        self.assertEqual(arg(objects, "--allow-announcers"), "true")
        self.assertEqual(arg(objects, "--bird-image"), "example.test/bird:2")
        roles = {r["metadata"]["name"]: r for r in find(objects, "ClusterRole")}
        self.assertIn("ccm-announcer", bind_names(objects))
        self.assertIn("ccm-announcer-namespace", bind_names(objects))
        # Read only on Services and EndpointSlices; Leases only through the namespace role.
        cluster = {(g, r): rule["verbs"] for rule in roles["ccm-announcer"]["rules"]
                   for g in rule["apiGroups"] for r in rule["resources"]}
        self.assertEqual(cluster, {("", "services"): ["list", "watch"],
                                   ("discovery.k8s.io", "endpointslices"): ["list", "watch"],
                                   ("", "nodes"): ["list", "watch"],
                                   ("events.k8s.io", "events"): ["create", "patch"],
                                   # Its metrics endpoint's reviews (spec.announcer.metricsPort).
                                   ("authentication.k8s.io", "tokenreviews"): ["create"],
                                   ("authorization.k8s.io", "subjectaccessreviews"): ["create"]})
        # In its namespace: its Lease and its ServiceAnnouncement records.
        self.assertEqual([r["resources"] for r in roles["ccm-announcer-namespace"]["rules"]],
                         [["leases"], ["serviceannouncements"]])

    def policy(self, objects, suffix):
        return one(objects, "ValidatingAdmissionPolicy", f"ccm-operator-{suffix}")

    @staticmethod
    def variable(policy, name):
        return next(v for v in policy["spec"]["variables"] if v["name"] == name)["expression"]

    def test_the_default_managed_namespace_is_a_dedicated_one_and_kube_system_remains_possible(self):
        objects = self.render_named()
        self.assertEqual(arg(objects, "--cloud-config-namespaces"), "ccm-system")
        self.assertEqual(verbs_for(namespace_rules(objects, "ccm-system"), "", "secrets"), {"get", "list", "watch"})
        self.assertEqual(namespace_rules(objects, "kube-system"), [], "no right at all in kube-system by default")
        # Still possible, at the cost docs/security.md states: every Secret there is readable.
        objects = self.render_named(values(**{"cloudConfig.namespaces": ["kube-system"]}))
        self.assertEqual(verbs_for(namespace_rules(objects, "kube-system"), "", "secrets"), {"get", "list", "watch"})
        bindings = self.policy(objects, "manager-bindings")
        self.assertEqual(json.loads(self.variable(bindings, "managedNamespaces")), ["kube-system"])

    def test_the_policies_check_deletes_and_updates_of_every_kind_the_operator_may_delete(self):
        for overlay in (None, values(**{"announcer.enabled": True, "embedded.enabled": True})):
            objects = self.render_named(overlay)
            sa = one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
            deletable = set()
            for rules in (operator_rules(objects), namespace_rules(objects, "ccm-system")):
                for rule in rules:
                    if "delete" in rule["verbs"]:
                        deletable |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
            owned = self.policy(objects, "owned-objects")
            checked = {(g, r) for rule in owned["spec"]["matchConstraints"]["resourceRules"]
                       for g in rule["apiGroups"] for r in rule["resources"]
                       if {"UPDATE", "DELETE"} <= set(rule["operations"])}
            self.assertTrue(deletable, "the operator deletes its children")
            self.assertLessEqual(deletable, checked, "a kind the operator may delete escapes the policy")
            self.assertIn(f'"system:serviceaccount:ccm-render:{sa}"', owned["spec"]["matchConditions"][0]["expression"])
            expressions = " ".join(v["expression"] for v in owned["spec"]["validations"] + owned["spec"]["variables"])
            self.assertIn("oldObject", expressions)
            self.assertIn("app.kubernetes.io/managed-by", expressions)
            self.assertIn("ccm.rs/owner-uid", expressions)
            # Lease writes are the other thing RBAC cannot narrow: the reserved names are checked.
            leases = self.policy(objects, "operator-leases")
            self.assertEqual(leases["spec"]["matchConstraints"]["resourceRules"][0]["resources"], ["leases"])

    def test_the_policies_render_images_on_repository_boundaries_and_the_reserved_leases(self):
        objects = self.render_named(values(**{
            "admissionPolicy.allowedImages": ["registry.example/ccm", "mirror.example/", "r.example:5000/x:v1",
                                              "r.example/y@sha256:" + "a" * 64],
            "manager.reservedLeaseNames": ["vendor-ccm", "metallb-*"]}))
        workloads = self.policy(objects, "manager-workloads")
        self.assertEqual(json.loads(self.variable(workloads, "exactImages")),
                         ["registry.example/ccm", "r.example:5000/x:v1", "r.example/y@sha256:" + "a" * 64])
        self.assertEqual(json.loads(self.variable(workloads, "imagePrefixes")),
                         ["registry.example/ccm:", "registry.example/ccm@", "mirror.example/"])
        self.assertEqual(arg(objects, "--allowed-images"),
                         "registry.example/ccm,mirror.example/,r.example:5000/x:v1,r.example/y@sha256:" + "a" * 64)
        self.assertEqual(arg(objects, "--reserved-lease-names"), "vendor-ccm,metallb-*")
        leases = self.policy(objects, "operator-leases")
        names = json.loads(self.variable(leases, "reservedNames"))
        prefixes = json.loads(self.variable(leases, "reservedPrefixes"))
        self.assertLessEqual({"kube-scheduler", "kube-controller-manager", "cloud-controller-manager", "vendor-ccm"},
                             set(names))
        self.assertEqual(prefixes, ["kube-", "apiserver-", "l2-announcer-", "metallb-"])
        # The operator's code reserves the same built-in names.
        conflicts = CHART.parent.parent / "operator" / "src" / "validate" / "conflicts.rs"
        if conflicts.exists():
            source = conflicts.read_text()
            for name in names[:4] + prefixes[:3]:
                self.assertIn(f'"{name}"', source, f"{name} is reserved by the chart but not by the operator")

    def test_the_workload_policy_requires_hardened_pods_and_the_tag_rules(self):
        objects = self.render_named(values(**{"announcer.enabled": True, "announcer.birdImage": "example.test/bird:2"}))
        workloads = self.policy(objects, "manager-workloads")
        messages = " ".join(v.get("message", "") + v.get("messageExpression", "") for v in workloads["spec"]["validations"])
        for field in ("runAsNonRoot", "capabilities.drop", "seccompProfile", "nodeName", "command", "tagged latest",
                      "lifecycle", "exec probes"):
            self.assertIn(field, messages)
        self.assertNotIn("pinned by digest", messages)
        commands = self.variable(workloads, "birdCommands")
        self.assertIn("exec bird -f -c /run/bird/bird.conf", commands)
        self.assertIn("exec bird -f -R -c /run/bird/bird.conf", commands)
        self.assertEqual(self.variable(workloads, "birdPreStop"), "['birdc', '-s', '/run/bird/bird.ctl', 'graceful', 'restart']")
        pinned = values(**{"admissionPolicy.requireDigest": True, "manager.image.digest": "sha256:" + "b" * 64})
        objects = self.render_named(pinned)
        self.assertEqual(arg(objects, "--require-image-digest"), "true")
        messages = " ".join(v.get("message", "") for v in self.policy(objects, "manager-workloads")["spec"]["validations"])
        self.assertIn("pinned by digest", messages)
        lenient = self.render_named(values(**{"admissionPolicy.allowLatestTag": True}))
        self.assertEqual(arg(lenient, "--allow-latest-image"), "true")
        messages = " ".join(v.get("message", "") for v in self.policy(lenient, "manager-workloads")["spec"]["validations"])
        self.assertNotIn("tagged latest", messages)
        for bad, needle in [({"admissionPolicy.requireDigest": True}, "manager.image.digest"),
                            ({"manager.image.tag": "latest"}, "allowLatestTag")]:
            with self.subTest(bad=bad):
                with self.assertRaises(Exception) as ctx:
                    self.render(values(**bad))
                self.assertIn(needle, str(ctx.exception))

    def test_resource_author_limits_beyond_images_reach_the_operator(self):
        objects = self.render()
        self.assertEqual(arg(objects, "--max-container-resources"), "cpu=2,memory=2Gi")
        self.assertEqual(arg(objects, "--allow-any-node"), "false")
        self.assertEqual(arg(objects, "--reserved-lease-names"), "")
        self.assertEqual(arg(objects, "--require-image-digest"), "false")
        self.assertEqual(arg(objects, "--allow-latest-image"), "false")
        self.assertEqual(arg(objects, "--manager-shadow-cluster-role"), "ccm-manager-shadow")
        self.assertIsNone(arg(objects, "--announcer-namespaces"))
        objects = self.render(values(**{"manager.maxContainerResources": {"cpu": 1, "memory": "1Gi", "ephemeral-storage": "1Gi"},
                                        "manager.allowAnyNode": True, "announcer.enabled": True,
                                        "announcer.namespaces": ["ccm-system"]}))
        self.assertEqual(arg(objects, "--max-container-resources"), "cpu=1,ephemeral-storage=1Gi,memory=1Gi")
        self.assertEqual(arg(objects, "--allow-any-node"), "true")
        self.assertEqual(arg(objects, "--announcer-namespaces"), "ccm-system")
        # Helm merges maps: null removes a default maximum; {} alone keeps them.
        objects = self.render(values(**{"manager.maxContainerResources": {"cpu": None, "memory": None}}))
        self.assertEqual(arg(objects, "--max-container-resources"), "")

    def test_a_shadow_manager_gets_a_cluster_role_that_writes_nothing(self):
        for overlay in (None, values(**{"manager.rbac.poolResources": True, "manager.rbac.importPools": True})):
            objects = self.render_named(overlay)
            shadow = one(objects, "ClusterRole", "ccm-manager-shadow")["rules"]
            for rule in shadow:
                writes = set(rule["verbs"]) - {"get", "list", "watch"}
                if writes:
                    self.assertEqual(writes, {"create", "patch"} & writes, rule)
                    self.assertTrue(set(rule["resources"]) <= {"events", "tokenreviews", "subjectaccessreviews"}, rule)
            self.assertEqual(verbs_for(shadow, "", "nodes"), {"get", "list", "watch"})
            self.assertEqual(verbs_for(shadow, "", "services"), {"get", "list", "watch"})
            self.assertEqual(verbs_for(shadow, "", "nodes/status") | verbs_for(shadow, "", "services/status"), set())
            self.assertEqual(verbs_for(shadow, "ccm.rs", "loadbalancerippools/status"), set())
            # The policies let the operator bind it, to a manager's account only.
            bindings = self.policy(objects, "manager-bindings")
            self.assertIn("'ccm-manager-shadow'", bindings["spec"]["validations"][0]["expression"])

    def test_an_upstream_image_gets_its_controllers_rights_and_no_secrets_configmaps_or_tokens(self):
        objects = self.render_named()
        self.assertEqual(arg(objects, "--manager-upstream-cluster-role"), "ccm-manager-upstream")
        rules = one(objects, "ClusterRole", "ccm-manager-upstream")["rules"]
        self.assertEqual(verbs_for(rules, "", "nodes"), {"get", "list", "watch", "update", "patch", "delete"})
        self.assertEqual(verbs_for(rules, "", "services"), {"get", "list", "watch", "update", "patch"})
        self.assertEqual(verbs_for(rules, "discovery.k8s.io", "endpointslices"), {"list", "watch"})
        for group, resource in [("", "secrets"), ("", "configmaps"), ("", "serviceaccounts"),
                                ("", "serviceaccounts/token"), ("", "persistentvolumes"), ("", "endpoints"),
                                ("coordination.k8s.io", "leases")]:
            self.assertEqual(verbs_for(rules, group, resource), set(), resource)
        self.assertTrue(all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules), rules)
        # The policies let the operator bind it to a manager's account, run the profiles'
        # commands, and pass --authentication-skip-lookup=true but no other --authentication-*.
        bindings = self.policy(objects, "manager-bindings")
        self.assertIn("'ccm-manager-upstream'", bindings["spec"]["validations"][0]["expression"])
        workloads = self.policy(objects, "manager-workloads")
        self.assertIn("/bin/aws-cloud-controller-manager", self.variable(workloads, "upstreamCommands"))
        args = next(v["expression"] for v in workloads["spec"]["validations"] if "authentication-skip-lookup" in v["expression"])
        self.assertIn("a == '--authentication-skip-lookup=true' || !a.matches", args)
        # Renamed, it is bound under the new name.
        objects = self.render_named(values(**{"manager.rbac.upstreamClusterRoleName": "green"}))
        one(objects, "ClusterRole", "green")
        self.assertEqual(arg(objects, "--manager-upstream-cluster-role"), "green")

    def test_announcers_read_the_nodes_and_the_pools_they_announce_from(self):
        def rules(overlay):
            objects = self.render_named(values(**{"announcer.enabled": True, **overlay}))
            return one(objects, "ClusterRole", "ccm-announcer")["rules"]

        plain = rules({})
        self.assertEqual(verbs_for(plain, "", "nodes"), {"list", "watch"})
        self.assertEqual(verbs_for(plain, "ccm.rs", "loadbalancerippools"), set())
        pools = rules({"manager.rbac.poolResources": True, "manager.rbac.importPools": True})
        for group, resource in [("ccm.rs", "loadbalancerippools"), ("metallb.io", "ipaddresspools"),
                                ("cilium.io", "ciliumloadbalancerippools")]:
            self.assertEqual(verbs_for(pools, group, resource), {"list", "watch"}, resource)
        for rule in pools:
            if rule["resources"] not in (["events"], ["tokenreviews"], ["subjectaccessreviews"]):
                self.assertEqual(set(rule["verbs"]), {"list", "watch"}, rule)

    def test_kube_vip_import_reads_one_configmap_in_its_namespace_and_nothing_else(self):
        def kube_vip(objects, namespace):
            roles = [r for r in find(objects, "Role") if r["metadata"]["name"].endswith("-import-kubevip")]
            bindings = [b for b in find(objects, "RoleBinding") if b["metadata"]["name"].endswith("-import-kubevip")]
            self.assertTrue(all(o["metadata"]["namespace"] == namespace for o in roles + bindings))
            return roles, bindings

        # Nothing without importPools, and never a ConfigMap right in the cluster-wide roles.
        self.assertEqual(kube_vip(self.render_named(), "kube-system"), ([], []))
        objects = self.render_named(values(**{"manager.rbac.poolResources": True, "manager.rbac.importPools": True,
                                              "cloudConfig.namespaces": ["ccm-system", "kube-public"]}))
        for name in ("ccm-manager", "ccm-manager-shadow", "ccm-manager-namespace"):
            self.assertEqual(verbs_for(one(objects, "ClusterRole", name)["rules"], "", "configmaps"), set(), name)
        (role,), (binding,) = kube_vip(objects, "kube-system")
        rules = role["rules"]
        self.assertEqual(verbs_for(rules, "", "configmaps", "kubevip"), {"get", "list", "watch"})
        self.assertEqual(verbs_for(rules, "", "configmaps", "other"), set(), "only the one ConfigMap, by name")
        self.assertEqual(verbs_for(rules, "", "configmaps"), set(), "no rule without resourceNames")
        self.assertEqual(len(rules), 1)
        self.assertEqual(binding["roleRef"], {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                              "name": role["metadata"]["name"]})
        self.assertEqual([(s["kind"], s["name"]) for s in binding["subjects"]],
                         [("Group", "system:serviceaccounts:ccm-system"), ("Group", "system:serviceaccounts:kube-public")])
        # kube-vip's KUBEVIP_NAMESPACE / KUBEVIP_CONFIG_MAP; embedded mode binds the operator too.
        objects = self.render_named(values(**{"manager.rbac.importPools": True, "embedded.enabled": True,
                                              "manager.rbac.importKubeVip": {"namespace": "kube-public", "name": "pools"}}))
        (role,), (binding,) = kube_vip(objects, "kube-public")
        self.assertEqual(role["rules"][0]["resourceNames"], ["pools"])
        sa = one(objects, "ServiceAccount")["metadata"]["name"]
        self.assertIn(("ServiceAccount", sa), [(s["kind"], s["name"]) for s in binding["subjects"]])
        # An empty namespace: no kube-vip rule at all.
        objects = self.render_named(values(**{"manager.rbac.importPools": True,
                                              "manager.rbac.importKubeVip": {"namespace": "", "name": "kubevip"}}))
        self.assertEqual(kube_vip(objects, ""), ([], []))

    def test_the_operator_binds_the_announcer_roles_only_in_announcer_namespaces(self):
        objects = self.render_named(values(**{"cloudConfig.namespaces": ["ccm-system", "kube-public"],
                                              "announcer.enabled": True, "announcer.namespaces": ["kube-public"]}))
        bind = lambda ns: [n for r in namespace_rules(objects, ns) if r["verbs"] == ["bind"] for n in r["resourceNames"]]
        self.assertEqual(bind("ccm-system"), ["ccm-manager-namespace"])
        self.assertEqual(bind("kube-public"), ["ccm-manager-namespace", "ccm-announcer-namespace"])
        bindings = self.policy(objects, "manager-bindings")
        self.assertEqual(json.loads(self.variable(bindings, "announcerNamespaces")), ["kube-public"])
        # Unset: every managed namespace.
        objects = self.render_named(values(**{"announcer.enabled": True}))
        self.assertEqual(json.loads(self.variable(self.policy(objects, "manager-bindings"), "announcerNamespaces")),
                         ["ccm-system"])

    def test_a_node_manager_gets_its_projects_node_rights_alone_and_only_its_own_account_and_command(self):
        objects = self.render_named()
        self.assertEqual(arg(objects, "--node-manager-cluster-role"), "ccm-node-manager")
        rules = one(objects, "ClusterRole", "ccm-node-manager")["rules"]
        self.assertEqual(verbs_for(rules, "", "nodes"), {"get", "list", "watch", "update", "patch"})
        self.assertEqual(verbs_for(rules, "", "nodes/status"), {"patch"})
        self.assertEqual(len(rules), 2, rules)
        # The policies let the operator bind it to a node manager's account only, and run the
        # profiles' node-manager commands in node-manager pods only.
        bindings = self.policy(objects, "manager-bindings")
        self.assertIn("'ccm-node-manager'", self.variable(bindings, "nodeManagerRole"))
        self.assertTrue(any("s.name.endsWith('-node-manager')" in v["expression"] for v in bindings["spec"]["validations"]))
        workloads = self.policy(objects, "manager-workloads")
        self.assertEqual(self.variable(workloads, "nodeManagerCommands"), "[['cloud-node-manager']]")
        # Renamed, it is installed, passed and bound under the new name.
        objects = self.render_named(values(**{"manager.rbac.nodeManagerClusterRoleName": "azure-nodes"}))
        one(objects, "ClusterRole", "azure-nodes")
        self.assertEqual(arg(objects, "--node-manager-cluster-role"), "azure-nodes")
        self.assertIn("'azure-nodes'", self.variable(self.policy(objects, "manager-bindings"), "nodeManagerRole"))

    def test_manager_role_names_are_configurable_and_consistent(self):
        objects = self.render(values(**{"manager.rbac.clusterRoleName": "blue", "embedded.enabled": True,
                                        "manager.rbac.namespaceRoleName": "blue-ns"}))
        one(objects, "ClusterRole", "blue")
        one(objects, "ClusterRole", "blue-ns")
        self.assertEqual(find(objects, "ClusterRole", "ccm-manager"), [])
        self.assertEqual(arg(objects, "--manager-cluster-role"), "blue")
        self.assertEqual(arg(objects, "--manager-namespace-role"), "blue-ns")
        bind = next(r for o in find(objects, "ClusterRole") for r in o["rules"] if "bind" in r["verbs"])
        self.assertEqual(bind["resourceNames"], ["blue", "ccm-manager-shadow", "ccm-manager-upstream", "ccm-node-manager"])
        bind = next(r for r in namespace_rules(objects, "ccm-system") if "bind" in r["verbs"])
        self.assertEqual(bind["resourceNames"], ["blue-ns"])
        embedded = sorted(b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding")
                          if b["roleRef"]["name"].startswith("blue"))
        self.assertEqual(embedded, ["blue", "blue-ns"])

    def test_manager_roles_can_be_left_to_someone_else(self):
        objects = self.render(values(**{"manager.rbac.create": False}))
        self.assertEqual([o["metadata"]["name"] for o in find(objects, "ClusterRole") if "manager" in o["metadata"]["name"]], [])
        self.assertEqual(arg(objects, "--manager-cluster-role"), "ccm-manager")

    def test_rbac_and_service_account_can_be_disabled(self):
        objects = self.render(values(**{"rbac.create": False, "serviceAccount.create": False,
                                        "serviceAccount.name": "existing"}))
        for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
            if kind == "ClusterRole":
                # The manager's (and node managers') ClusterRoles have their own switch (manager.rbac.create).
                self.assertEqual([o for o in find(objects, kind)
                                  if "ccm-manager" not in o["metadata"]["name"] and o["metadata"]["name"] != "ccm-node-manager"], [])
            else:
                self.assertEqual(find(objects, kind), [], kind)
        self.assertEqual(one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"], "existing")

    def test_service_account_name_is_required_when_not_created(self):
        with self.assertRaises(Exception) as ctx:
            self.render(values(**{"serviceAccount.create": False}))
        self.assertIn("serviceAccount.name is required", str(ctx.exception))

    def test_full_overlay_passes_every_scheduling_and_image_setting_through(self):
        overlay = helmlib.load_yaml(CHART / "ci" / "full-values.yaml")
        objects = self.render(overlay)
        deployment = one(objects, "Deployment", "ccm")
        pod = deployment["spec"]["template"]["spec"]
        self.assertEqual(pod["imagePullSecrets"], [{"name": "regcred"}])
        self.assertEqual(pod["nodeSelector"], overlay["nodeSelector"])
        self.assertEqual(pod["tolerations"][-len(overlay["tolerations"]):], overlay["tolerations"])
        self.assertEqual(pod["priorityClassName"], "system-cluster-critical")
        self.assertEqual(pod["serviceAccountName"], "ccm-operator-sa")
        self.assertEqual(deployment["spec"]["template"]["metadata"]["annotations"]["example.com/team"], "platform")
        self.assertEqual(deployment["spec"]["template"]["metadata"]["labels"]["example.com/tier"], "control-plane")
        c = container(objects)
        self.assertEqual(c["image"], f"registry.example.com/ccm-operator@{overlay['image']['digest']}")
        self.assertEqual(c["imagePullPolicy"], "Always")
        self.assertEqual(c["args"][-1], "--example-flag=1")
        self.assertEqual(arg(objects, "--namespaces"), "kube-system,cloud")
        self.assertEqual(arg(objects, "--http-address"), "0.0.0.0:9090")
        self.assertEqual(arg(objects, "--manager-image"), "registry.example.com/cloud-controller-manager:0.1.0-rc.1")
        self.assertIn({"name": "RUST_LOG", "value": "info,operator=debug"}, c["env"])
        self.assertIn({"name": "EXTRA", "value": "1"}, c["env"])
        self.assertEqual(one(objects, "ServiceAccount")["metadata"]["annotations"], {"example.com/owner": "platform"})

        affinity = self.render(helmlib.load_yaml(CHART / "ci" / "ha-values.yaml"))
        self.assertEqual(one(affinity, "Deployment")["spec"]["template"]["spec"]["affinity"],
                         helmlib.load_yaml(CHART / "ci" / "ha-values.yaml")["affinity"])

    def test_image_digests_pin_the_operator_and_manager_images_over_their_tags(self):
        operator_digest = "sha256:" + "a" * 64
        manager_digest = "sha256:" + "b" * 64
        objects = self.render(values(**{"image.tag": "1.2.3", "image.digest": operator_digest,
                                        "manager.image.tag": "1.2.3", "manager.image.digest": manager_digest}))
        self.assertEqual(container(objects)["image"], f"ghcr.io/ccm-rs/ccm-operator@{operator_digest}")
        self.assertEqual(arg(objects, "--manager-image"), f"ghcr.io/ccm-rs/cloud-controller-manager@{manager_digest}")
        # Without a digest: the tag, else the chart's appVersion.
        objects = self.render(values(**{"manager.image.tag": "1.2.3"}))
        self.assertEqual(container(objects)["image"], f"ghcr.io/ccm-rs/ccm-operator:{APP_VERSION}")
        self.assertEqual(arg(objects, "--manager-image"), "ghcr.io/ccm-rs/cloud-controller-manager:1.2.3")
        with self.assertRaises(Exception) as ctx:
            self.render(values(**{"manager.image.digest": "sha256:short"}))
        self.assertIn("digest", str(ctx.exception))

    def test_service_monitor_only_when_enabled_and_aimed_at_the_metrics_service(self):
        self.assertEqual(find(self.render(), "ServiceMonitor"), [])
        objects = self.render(values(**{"serviceMonitor.enabled": True, "serviceMonitor.labels": {"release": "prom"}}))
        monitor = one(objects, "ServiceMonitor")
        service = one(objects, "Service")
        self.assertEqual(monitor["metadata"]["labels"]["release"], "prom")
        for key, value in monitor["spec"]["selector"]["matchLabels"].items():
            self.assertEqual(service["metadata"]["labels"].get(key), value)
        self.assertEqual(monitor["spec"]["endpoints"][0]["port"], service["spec"]["ports"][0]["name"])
        self.assertEqual(service["spec"]["selector"], one(objects, "Deployment")["spec"]["selector"]["matchLabels"])

    def test_service_monitor_scrapes_https_with_prometheus_token_and_skips_verification_only_by_default(self):
        endpoint = one(self.render(values(**{"serviceMonitor.enabled": True})), "ServiceMonitor")["spec"]["endpoints"][0]
        self.assertEqual(endpoint["scheme"], "https")
        self.assertEqual(endpoint["bearerTokenFile"], "/var/run/secrets/kubernetes.io/serviceaccount/token")
        self.assertEqual(endpoint["tlsConfig"], {"insecureSkipVerify": True})
        self.assertNotIn("authorization", endpoint)
        # A token from a Secret instead, and a verifiable certificate.
        tls = {"insecureSkipVerify": False, "serverName": "ccm-operator-metrics.ccm-system.svc",
               "ca": {"secret": {"name": "ccm-operator-tls", "key": "ca.crt"}}}
        objects = self.render(values(**{"serviceMonitor.enabled": True, "serviceMonitor.tlsConfig": tls,
                                        "serviceMonitor.authorizationSecret.name": "prometheus-token"}))
        endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
        self.assertEqual(endpoint["authorization"],
                         {"type": "Bearer", "credentials": {"name": "prometheus-token", "key": "token"}})
        self.assertNotIn("bearerTokenFile", endpoint)
        self.assertEqual(endpoint["tlsConfig"], tls)

    def install_certificate_crd(self) -> None:
        """A minimal cert-manager Certificate CRD, so a chart with http.tls.certManager can install."""
        self.cluster.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "certificates.cert-manager.io"},
            "spec": {
                "group": "cert-manager.io",
                "scope": "Namespaced",
                "names": {"plural": "certificates", "singular": "certificate", "kind": "Certificate",
                          "listKind": "CertificateList"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
            },
        })
        # The API server needs a moment to serve a new CRD's resource.
        for _ in range(50):
            status, _ = self.cluster.request("GET", "/apis/cert-manager.io/v1")
            if status == 200:
                return
            time.sleep(0.1)
        raise AssertionError("the Certificate CRD is not served")

    def serving_cert(self, objects):
        """(volume, mount, args) of the operator's serving certificate, each None when absent."""
        pod = one(objects, "Deployment")["spec"]["template"]["spec"]
        volume = next((v for v in pod.get("volumes", []) if v["name"] == "serving-cert"), None)
        mount = next((m for m in container(objects).get("volumeMounts", []) if m["name"] == "serving-cert"), None)
        return volume, mount, (arg(objects, "--tls-cert-file"), arg(objects, "--tls-private-key-file"))

    def test_without_a_certificate_the_operator_is_self_signed_and_the_service_monitor_skips_verification(self):
        objects = self.render(values(**{"serviceMonitor.enabled": True}))
        self.assertEqual(self.serving_cert(objects), (None, None, (None, None)))
        self.assertEqual(one(objects, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"], {"insecureSkipVerify": True})
        self.assertEqual(find(objects, "Certificate"), [])

    def test_a_serving_certificate_secret_is_mounted_passed_to_the_operator_and_verified_by_the_service_monitor(self):
        objects = self.render_named(values(**{"serviceMonitor.enabled": True, "http.tls.secretName": "operator-tls"}))
        volume, mount, (cert, key) = self.serving_cert(objects)
        self.assertEqual(volume["secret"], {"secretName": "operator-tls", "defaultMode": 0o440})
        self.assertEqual(mount, {"name": "serving-cert", "mountPath": "/etc/ccm-operator/tls", "readOnly": True})
        # No subPath: the kubelet's updates of the Secret reach the files, which the operator re-reads.
        self.assertEqual((cert, key), ("/etc/ccm-operator/tls/tls.crt", "/etc/ccm-operator/tls/tls.key"))
        self.assertEqual(one(objects, "Deployment")["spec"]["template"]["spec"]["securityContext"]["fsGroup"], 65532)
        endpoint = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]
        service = one(objects, "Service")["metadata"]["name"]
        self.assertEqual(endpoint["tlsConfig"], {"ca": {"secret": {"name": "operator-tls", "key": "ca.crt"}},
                                                 "serverName": f"{service}.ccm-render.svc"})
        self.assertEqual(find(objects, "Certificate"), [], "a Certificate only when certManager.enabled")
        # An explicit tlsConfig still wins.
        mine = {"insecureSkipVerify": False, "serverName": "x.example"}
        objects = self.render(values(**{"serviceMonitor.enabled": True, "http.tls.secretName": "operator-tls",
                                        "serviceMonitor.tlsConfig": mine}))
        self.assertEqual(one(objects, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"], mine)

    def test_cert_manager_certificate_only_when_asked_for_the_names_the_service_monitor_verifies(self):
        self.install_certificate_crd()
        # Leave the shared server's cluster-wide objects as they were.
        self.addCleanup(self.cluster.request, "DELETE",
                        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/certificates.cert-manager.io")
        issuer = {"name": "cluster-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
        objects = self.render_named(values(**{"serviceMonitor.enabled": True, "http.tls.certManager.enabled": True,
                                              "http.tls.certManager.issuerRef": issuer}))
        certificate = one(objects, "Certificate")
        self.assertEqual(certificate["apiVersion"], "cert-manager.io/v1")
        self.assertEqual(certificate["spec"]["issuerRef"], issuer)
        secret = certificate["spec"]["secretName"]
        self.assertEqual(secret, "ccm-operator-tls")
        volume, _, (cert, _) = self.serving_cert(objects)
        self.assertEqual(volume["secret"]["secretName"], secret)
        self.assertEqual(cert, "/etc/ccm-operator/tls/tls.crt")
        tls = one(objects, "ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"]
        self.assertEqual(tls["ca"]["secret"]["name"], secret)
        self.assertIn(tls["serverName"], certificate["spec"]["dnsNames"])
        self.assertIn("server auth", certificate["spec"]["usages"])
        # A Secret name given: the Certificate writes there.
        objects = self.render(values(**{"http.tls.certManager.enabled": True, "http.tls.secretName": "mine",
                                        "http.tls.certManager.issuerRef.name": "ca"}))
        self.assertEqual(one(objects, "Certificate")["spec"]["secretName"], "mine")
        with self.assertRaises(Exception) as ctx:
            self.render(values(**{"http.tls.certManager.enabled": True}))
        self.assertIn("issuerRef.name", str(ctx.exception))

    def test_a_mounted_key_needs_an_fs_group_to_be_readable(self):
        with self.assertRaises(Exception) as ctx:
            # null removes the default's fsGroup (Helm merges maps).
            self.render(values(**{"http.tls.secretName": "operator-tls", "podSecurityContext.fsGroup": None}))
        self.assertIn("fsGroup", str(ctx.exception))

    def test_tls_min_version_and_cipher_suites_reach_the_operator_and_unknown_versions_are_refused(self):
        suites = ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"]
        objects = self.render(values(**{"http.tls.minVersion": "VersionTLS13", "http.tls.cipherSuites": suites}))
        self.assertEqual(arg(objects, "--tls-min-version"), "VersionTLS13")
        self.assertEqual(arg(objects, "--tls-cipher-suites"), ",".join(suites))
        defaults = self.render()
        self.assertIsNone(arg(defaults, "--tls-min-version"))
        self.assertIsNone(arg(defaults, "--tls-cipher-suites"))
        main = (CHART.parent.parent / "operator" / "src" / "main.rs")
        if main.exists():
            for field in ("tls_min_version", "tls_cipher_suites", "tls_cert_file", "tls_private_key_file"):
                self.assertIn(f"    {field}: String,", main.read_text(), f"ccm-operator lacks --{field}")
        for bad in ({"http.tls.minVersion": "VersionTLS10"}, {"http.tls.cipherSuites": ["rc4"]}):
            with self.subTest(bad=bad):
                with self.assertRaises(Exception) as ctx:
                    self.render(values(**bad))
                self.assertIn("schema", str(ctx.exception))

    def test_metrics_reader_grants_get_on_metrics_only_and_binds_only_the_given_subjects(self):
        objects = self.render_named()
        role = one(objects, "ClusterRole", "ccm-operator-metrics-reader")
        self.assertEqual(role["rules"], [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])
        self.assertEqual(find(objects, "ClusterRoleBinding", "ccm-operator-metrics-reader"), [])
        subjects = [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"},
                    {"kind": "Group", "name": "metrics-scrapers"}]
        binding = one(self.render_named(values(**{"metricsReader.subjects": subjects})),
                      "ClusterRoleBinding", "ccm-operator-metrics-reader")
        self.assertEqual(binding["roleRef"]["name"], "ccm-operator-metrics-reader")
        self.assertEqual(binding["subjects"], [subjects[0], {**subjects[1], "apiGroup": "rbac.authorization.k8s.io"}])
        self.assertEqual(find(self.render(values(**{"metricsReader.create": False})), "ClusterRole",
                              "ccm-operator-metrics-reader"), [])

    def test_operator_and_managers_may_create_token_and_access_reviews_for_their_endpoints_and_nothing_more(self):
        objects = self.render()
        for rules in (operator_rules(objects), one(objects, "ClusterRole", "ccm-manager")["rules"]):
            self.assertEqual(verbs_for(rules, "authentication.k8s.io", "tokenreviews"), {"create"})
            self.assertEqual(verbs_for(rules, "authorization.k8s.io", "subjectaccessreviews"), {"create"})
            self.assertEqual(verbs_for(rules, "authorization.k8s.io", "localsubjectaccessreviews"), set())

    def test_service_monitor_without_the_metrics_service_is_refused(self):
        with self.assertRaises(Exception) as ctx:
            self.render(values(**{"serviceMonitor.enabled": True, "metrics.service.enabled": False}))
        self.assertIn("metrics.service.enabled", str(ctx.exception))

    def test_schema_errors_name_the_offending_value(self):
        for overlay, needle in [(values(replicas=-1), "replicas"), (values(bogus=True), "bogus")]:
            with self.subTest(needle=needle):
                with self.assertRaises(Exception) as ctx:
                    self.render(overlay)
                message = str(ctx.exception)
                self.assertIn("schema", message)
                self.assertIn(needle, message)


class _Installed(unittest.TestCase):
    """A real `helm install` into the test API server; each class has its own release, namespace
    and manager ClusterRole name, so classes never collide on cluster-scoped objects."""

    NS = ""
    VALUES: dict[str, Any] = {}

    @classmethod
    def setUpClass(cls):
        if not KUBECONFIG:
            raise AssertionError("CI=true but CHART_TEST_KUBECONFIG is not set")
        cls.cluster = Cluster(KUBECONFIG)
        cls.release = cls.cluster.install("ccm-operator", cls.NS, cls.VALUES)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.cluster.uninstall("ccm-operator", cls.NS)
        except Exception:
            pass  # already uninstalled by the test


@needs_cluster
class Install(_Installed):
    """The default install (with Embedded mode allowed), and what exists afterwards."""

    NS = "ccm-system"
    VALUES = values(**{"embedded.enabled": True})

    def test_install_creates_the_operator_and_its_rbac(self):
        c = self.cluster
        self.assertEqual(self.release["info"]["status"], "deployed")
        for path in [
            f"/apis/apps/v1/namespaces/{self.NS}/deployments/ccm-operator",
            f"/api/v1/namespaces/{self.NS}/serviceaccounts/ccm-operator",
            f"/api/v1/namespaces/{self.NS}/services/ccm-operator-metrics",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/ccm-operator",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/ccm-manager",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles/ccm-manager-namespace",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/ccm-operator",
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/ccm-operator-embedded-ccm-manager",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/ccm-system/rolebindings/ccm-operator-embedded-ccm-manager-namespace",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/ccm-system/roles/ccm-operator-namespace",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/ccm-system/rolebindings/ccm-operator-namespace",
        ]:
            with self.subTest(path=path):
                obj = c.get(path)
                self.assertIsNotNone(obj, f"{path} was not created")
                self.assertEqual(obj["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm")
        deployment = c.get(f"/apis/apps/v1/namespaces/{self.NS}/deployments/ccm-operator")
        self.assertEqual(deployment["spec"]["template"]["spec"]["serviceAccountName"], "ccm-operator")

    def test_install_creates_the_crd_from_crds_and_it_serves_the_examples(self):
        c = self.cluster
        crd = c.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name()}")
        self.assertIsNotNone(crd)
        self.assertEqual(crd["spec"]["group"], "ccm.rs")
        # Objects from crds/ carry no release metadata: Helm never upgrades or deletes them.
        self.assertNotIn("meta.helm.sh/release-name", crd["metadata"].get("annotations") or {})
        for path in sorted((CHART / "examples").glob("*.yaml")):
            example = helmlib.load_yaml(path)
            ns, name = example["metadata"]["namespace"], example["metadata"]["name"]
            with self.subTest(example=path.name):
                c.ensure_namespace(ns)
                c.create(f"/apis/ccm.rs/v1alpha1/namespaces/{ns}/cloudcontrollermanagers", example)
                got = c.get(f"/apis/ccm.rs/v1alpha1/namespaces/{ns}/cloudcontrollermanagers/{name}")
                self.assertEqual(got["spec"]["provider"], example["spec"]["provider"])


@needs_cluster
class Upgrade(_Installed):
    """`helm upgrade`: the release changes, the CRD does not (hence crds.manage)."""

    NS = "ccm-upgrade"
    VALUES = values(**{"manager.rbac.clusterRoleName": "ccm-manager-upgrade",
                       "manager.rbac.namespaceRoleName": "ccm-manager-namespace-upgrade"})

    def test_helm_upgrade_changes_the_release_but_never_the_crd(self):
        c = self.cluster
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name()}"
        status, body = c.request("PATCH", path, {"metadata": {"labels": {"chart-test/marker": "before-upgrade"}}},
                                 content_type="application/merge-patch+json")
        self.assertEqual(status, 200, body)
        upgraded = c.upgrade("ccm-operator", self.NS, helmlib.merge(self.VALUES, values(replicas=2)))
        self.assertEqual(upgraded["version"], 2)
        # The release moved on: two replicas, leader election, a disruption budget ...
        deployment = c.get(f"/apis/apps/v1/namespaces/{self.NS}/deployments/ccm-operator")
        self.assertEqual(deployment["spec"]["replicas"], 2)
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        self.assertIn("--leader-elect=true", args)
        self.assertIsNotNone(c.get(f"/apis/policy/v1/namespaces/{self.NS}/poddisruptionbudgets/ccm-operator"))
        # ... but Helm left the CRD as it was: the operator (crds.manage) is what upgrades it.
        self.assertEqual(c.get(path)["metadata"]["labels"].get("chart-test/marker"), "before-upgrade")
        c.request("PATCH", path, {"metadata": {"labels": {"chart-test/marker": None}}},
                  content_type="application/merge-patch+json")


@needs_cluster
class Uninstall(_Installed):
    """`helm uninstall` removes the operator but keeps the CRD, and so every resource."""

    NS = "ccm-uninstall"
    VALUES = values(**{"manager.rbac.clusterRoleName": "ccm-manager-uninstall",
                       "manager.rbac.namespaceRoleName": "ccm-manager-namespace-uninstall"})

    def test_uninstall_removes_the_release_but_keeps_the_crd(self):
        c = self.cluster
        self.assertIsNotNone(c.get(f"/apis/apps/v1/namespaces/{self.NS}/deployments/ccm-operator"))
        c.uninstall("ccm-operator", self.NS)
        self.assertIsNone(c.get(f"/apis/apps/v1/namespaces/{self.NS}/deployments/ccm-operator"))
        self.assertIsNone(c.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/ccm-manager-uninstall"))
        self.assertIsNone(c.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/ccm-manager-namespace-uninstall"))
        self.assertIsNotNone(c.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name()}"))


if __name__ == "__main__":
    unittest.main()
