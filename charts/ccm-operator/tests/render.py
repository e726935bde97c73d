#!/usr/bin/env python3
"""Prints the chart as rendered by real Helm, as a JSON list of objects:

    python3 render.py --kubeconfig PATH [--values JSON]

For Rust tests that need the chart's objects (the RBAC proof). helm-sdkpy has no `template`
action, so this installs into the given API server and uninstalls again. Exit codes as run.py:
77 when a tool is missing outside CI.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--values", default="{}", help="values as a JSON object")
    parser.add_argument("--release", default="ccm-operator")
    parser.add_argument("--namespace", default="ccm-system")
    args = parser.parse_args()

    if "HELM_DRIVER" not in os.environ:  # see run.py
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "HELM_DRIVER": "memory"})
    missing = run.missing_tools()
    if missing:
        print(f"render: missing {', '.join(missing)}; install with: {run.INSTALL_HINT}", file=sys.stderr)
        return 1 if run.IN_CI else run.SKIPPED

    import helmlib

    objects = helmlib.Cluster(args.kubeconfig).render(json.loads(args.values), args.release, args.namespace)
    json.dump(objects, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
