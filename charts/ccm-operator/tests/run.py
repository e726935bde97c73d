#!/usr/bin/env python3
"""Runs the chart tests: `python3 run.py [--kubeconfig PATH]`.

Exit codes: 0 passed, 1 failed, 77 skipped (a tool is missing and CI is not "true"). In CI a
missing tool is a failure: `.ci/run` installs helm-sdkpy and PyYAML, so their absence is a bug.
"""

from __future__ import annotations

import argparse
import os
import sys
import unittest
from pathlib import Path

sys.dont_write_bytecode = True  # keep __pycache__ out of the chart

SKIPPED = 77
IN_CI = os.environ.get("CI") == "true"
INSTALL_HINT = "pip install --ignore-requires-python helm-sdkpy pyyaml"


def missing_tools() -> list[str]:
    missing = []
    try:
        import yaml  # noqa: F401
    except ImportError:
        missing.append("PyYAML")
    try:
        import helm_sdkpy

        helm_sdkpy.get_version()  # loads the bundled Helm library
    except Exception as e:  # ImportError, or a library that cannot load on this platform
        missing.append(f"helm-sdkpy ({type(e).__name__}: {e})")
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", help="API server to install into (render and install tests)")
    parser.add_argument("-k", dest="pattern", help="only tests whose name contains this")
    args = parser.parse_args()

    # Helm keeps releases in Secrets written as protobuf, which the local test API server does not
    # speak (it is JSON only); keep them in memory instead. The chart's objects still go through
    # the API server as usual. Set HELM_DRIVER yourself to test against a real cluster. The Helm
    # library (Go) only sees the environment the process started with, hence the re-exec.
    if "HELM_DRIVER" not in os.environ:
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "HELM_DRIVER": "memory"})

    missing = missing_tools()
    if missing:
        print(f"chart tests: missing {', '.join(missing)}; install with: {INSTALL_HINT}", flush=True)
        if IN_CI:
            print("chart tests: FAILED: CI=true, so a missing tool is an error, not a skip", flush=True)
            return 1
        print("chart tests: SKIPPED", flush=True)
        return SKIPPED

    if args.kubeconfig:
        os.environ["CHART_TEST_KUBECONFIG"] = args.kubeconfig
    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    import helm_sdkpy

    print(f"chart tests: {helm_sdkpy.get_version()}, kubeconfig: {args.kubeconfig or 'none'}", flush=True)
    loader = unittest.TestLoader()
    if args.pattern:
        loader.testNamePatterns = [f"*{args.pattern}*"]
    suite = loader.discover(str(here), pattern="test_*.py", top_level_dir=str(here))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    print(
        f"chart-tests: {result.testsRun - len(result.failures) - len(result.errors) - len(result.skipped)} passed, "
        f"{len(result.failures) + len(result.errors)} failed, {len(result.skipped)} skipped",
        flush=True,
    )
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
