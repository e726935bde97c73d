"""Helpers for the chart tests: real Helm through helm-sdkpy, values merging, and a tiny
read-only Kubernetes client for checking what an install created.

Only the standard library, helm-sdkpy and PyYAML are used; `.ci/run` installs the latter two.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import shutil
import ssl
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import helm_sdkpy as helm
import yaml

CHART = Path(__file__).resolve().parent.parent
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))

# Lint message severities (helm's support.Severity).
SEVERITY_ERROR = 3


def chart_values() -> dict[str, Any]:
    """The chart's default values."""
    return yaml.safe_load((CHART / "values.yaml").read_text())


def load_yaml(path: Path) -> dict[str, Any]:
    """One YAML document as a dict."""
    return yaml.safe_load(path.read_text()) or {}


def merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Coalesce `overlay` over `base` the way Helm merges a values file over the chart's."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _config(kubeconfig: str | None, namespace: str = "default") -> helm.Configuration:
    # Lint needs no cluster; helm-sdkpy still wants a configuration handle.
    return helm.Configuration(namespace=namespace, kubeconfig=kubeconfig or os.devnull)


def lint(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Lint the chart, with `values` replacing values.yaml when given (helm-sdkpy's lint takes no
    values files, so the chart is copied and its values.yaml rewritten, as `helm lint -f` would
    coalesce them). Returns the error-level messages."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = CHART
        if values is not None:
            chart = Path(tmp) / CHART.name
            shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("tests", "__pycache__"))
            (chart / "values.yaml").write_text(json.dumps(values, indent=2))
        result = asyncio.run(helm.Lint(_config(None)).run(str(chart)))
    return [m for m in result.get("Messages") or [] if m.get("Severity", 0) >= SEVERITY_ERROR]


class Cluster:
    """A Kubernetes API server reached through a kubeconfig file."""

    def __init__(self, kubeconfig: str):
        self.kubeconfig = kubeconfig
        self._configs: dict[str, helm.Configuration] = {}
        config = yaml.safe_load(Path(kubeconfig).read_text())
        current = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next((u.get("user") or {} for u in config.get("users") or [] if u["name"] == context.get("user")), {})
        self.server = cluster["server"].rstrip("/")
        self.token = user.get("token")
        self.ssl = None
        if self.server.startswith("https"):
            self.ssl = ssl.create_default_context()
            if cluster.get("insecure-skip-tls-verify"):
                self.ssl.check_hostname = False
                self.ssl.verify_mode = ssl.CERT_NONE
            elif cluster.get("certificate-authority-data"):
                self.ssl.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
            if user.get("client-certificate-data") and user.get("client-key-data"):
                # ssl takes the client pair from files only: a private temporary directory.
                with tempfile.TemporaryDirectory() as tmp:
                    cert, key = Path(tmp, "client.crt"), Path(tmp, "client.key")
                    cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
                    key.write_bytes(base64.b64decode(user["client-key-data"]))
                    self.ssl.load_cert_chain(cert, key)

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """One request; returns the status code and the decoded JSON body."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, context=self.ssl, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        """GET `path`; None on 404."""
        status, body = self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise AssertionError(f"GET {path}: HTTP {status}: {body}")
        return body

    def create(self, path: str, obj: dict[str, Any]) -> Any:
        """POST `obj` to the collection at `path`; an existing object is fine."""
        status, body = self.request("POST", path, obj)
        if status not in (200, 201, 202, 409):
            raise AssertionError(f"POST {path}: HTTP {status}: {body}")
        return body

    def install_servicemonitor_crd(self) -> None:
        """A minimal ServiceMonitor CRD, so a chart with serviceMonitor.enabled can install."""
        self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {"plural": "servicemonitors", "singular": "servicemonitor", "kind": "ServiceMonitor",
                          "listKind": "ServiceMonitorList"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
            },
        })

    def _helm(self, namespace: str) -> helm.Configuration:
        # One configuration per namespace: with HELM_DRIVER=memory the releases live in it.
        if namespace not in self._configs:
            self._configs[namespace] = _config(self.kubeconfig, namespace)
        return self._configs[namespace]

    def install(self, release: str, namespace: str, values: dict[str, Any] | None = None, **opts: Any) -> dict:
        """`helm install` (no waiting: nothing runs pods on the test server)."""
        self.ensure_namespace(namespace)
        action = helm.Install(self._helm(namespace))
        return asyncio.run(action.run(release, str(CHART), values=values, wait=False, timeout=120, **opts))

    def ensure_namespace(self, namespace: str) -> None:
        """Create `namespace` if missing. Helm's own --create-namespace validates the Namespace
        against the server's OpenAPI document, which a test server need not serve."""
        self.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def upgrade(self, release: str, namespace: str, values: dict[str, Any] | None = None, **opts: Any) -> dict:
        """`helm upgrade`."""
        action = helm.Upgrade(self._helm(namespace))
        return asyncio.run(action.run(release, str(CHART), values=values, wait=False, timeout=120, **opts))

    def uninstall(self, release: str, namespace: str) -> dict:
        """`helm uninstall`."""
        return asyncio.run(helm.Uninstall(self._helm(namespace)).run(release, wait=False, timeout=120))

    def render(self, values: dict[str, Any] | None = None, release: str = "ccm-operator",
               namespace: str = "ccm-render") -> list[dict[str, Any]]:
        """What `helm template` would print: helm-sdkpy has no template action, so install,
        read the release manifest, and uninstall again so the next render starts clean."""
        result = self.install(release, namespace, values)
        try:
            return parse_manifest(manifest_of(result))
        finally:
            self.uninstall(release, namespace)


def manifest_of(release: dict[str, Any]) -> str:
    """The rendered manifest of a release returned by install or upgrade."""
    for key in ("manifest", "Manifest"):
        if isinstance(release.get(key), str):
            return release[key]
    nested = release.get("release") or release.get("Release")
    if isinstance(nested, dict):
        return manifest_of(nested)
    raise AssertionError(f"no manifest in the release result; keys: {sorted(release)}")


def parse_manifest(text: str) -> list[dict[str, Any]]:
    """Every object of a multi-document manifest."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    """Objects of `kind` (and `name`, when given)."""
    return [o for o in objects if o.get("kind") == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The single object of `kind` (and `name`); fails unless exactly one."""
    found = find(objects, kind, name)
    if len(found) != 1:
        names = [o["metadata"]["name"] for o in find(objects, kind)]
        raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)} among {names}")
    return found[0]
