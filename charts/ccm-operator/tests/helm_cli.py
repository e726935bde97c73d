#!/usr/bin/env python3
"""A stand-in for the `helm` command line, for the tested walk-through (docs/quickstart.md) on
machines without the Helm CLI: the same Helm, through helm-sdkpy. Only what the walk-through
uses is understood:

    helm install NAME CHART [--namespace|-n NS] [--create-namespace] [--set a.b=c ...]
    helm upgrade NAME CHART [--namespace|-n NS] [--set a.b=c ...]
    helm uninstall NAME [--namespace|-n NS]

The API server comes from $KUBECONFIG. Releases are stored as Helm stores them (Secrets in the
release's namespace) unless HELM_DRIVER says otherwise: with HELM_DRIVER=memory an install is
forgotten when the command exits, so upgrade and uninstall need the default driver. Exit codes as run.py (77: a tool is missing outside CI).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))

import run  # noqa: E402  (shares the tool checks and exit codes)


def parse_set(pairs: list[str]) -> dict:
    """`--set a.b=c` into nested values; true/false/integers become JSON values, as Helm does."""
    values: dict = {}
    for pair in pairs:
        path, _, raw = pair.partition("=")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        node = values
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return values


def main() -> int:
    parser = argparse.ArgumentParser(prog="helm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    install = sub.add_parser("install")
    install.add_argument("name")
    install.add_argument("chart")
    install.add_argument("--namespace", "-n", default="default")
    install.add_argument("--create-namespace", action="store_true")
    install.add_argument("--set", action="append", default=[])
    upgrade = sub.add_parser("upgrade")
    upgrade.add_argument("name")
    upgrade.add_argument("chart")
    upgrade.add_argument("--namespace", "-n", default="default")
    upgrade.add_argument("--set", action="append", default=[])
    uninstall = sub.add_parser("uninstall")
    uninstall.add_argument("name")
    uninstall.add_argument("--namespace", "-n", default="default")
    args = parser.parse_args()

    missing = run.missing_tools()
    if missing:
        print(f"helm: missing {', '.join(missing)}; install with: {run.INSTALL_HINT}", file=sys.stderr)
        return 1 if run.IN_CI else run.SKIPPED
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        print("helm: KUBECONFIG is not set", file=sys.stderr)
        return 1
    if args.command != "uninstall" and Path(args.chart).resolve() != run_chart():
        print(f"helm: only this repository's chart is supported, not {args.chart}", file=sys.stderr)
        return 1

    import helmlib

    cluster = helmlib.Cluster(kubeconfig)
    if args.command == "uninstall":
        cluster.uninstall(args.name, args.namespace)
        print(f'release "{args.name}" uninstalled')
        return 0
    if args.command == "upgrade":
        release = cluster.upgrade(args.name, args.namespace, parse_set(args.set))
    else:
        release = cluster.install(args.name, args.namespace, parse_set(args.set))
    print(f"NAME: {release.get('name')}\nNAMESPACE: {release.get('namespace')}\nSTATUS: {release['info']['status']}")
    print(f"NOTES:\n{release['info'].get('notes', '')}")
    return 0


def run_chart() -> Path:
    return Path(__file__).resolve().parent.parent


if __name__ == "__main__":
    sys.exit(main())
