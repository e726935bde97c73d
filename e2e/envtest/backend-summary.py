#!/usr/bin/env python3
"""Reads `cargo test` output on stdin and prints, per test binary, how many tests ran on each
backend (tests named `<scenario>::local` / `<scenario>::genuine` by `backend_tests!`, and every
test of the real-cluster binary, tests/realcluster.rs). A crate's integration tests are one
binary (`tests/<name>/main.rs`) with a module per area; its rows are per module."""
import re
import sys

SKIPPED = "genuine kube-apiserver runs skipped"
REAL_SKIPPED = "real-cluster runs skipped"
skipped = False
real_skipped = False
binary = None
counts = {}
passed = failed = 0
order = []
for line in sys.stdin:
    skipped = skipped or SKIPPED in line
    real_skipped = real_skipped or REAL_SKIPPED in line
    m = re.match(r"test result: \w+\. (\d+) passed; (\d+) failed", line)
    if m:
        passed += int(m.group(1))
        failed += int(m.group(2))
        continue
    m = re.match(r"\s*Running (?:unittests )?(\S+)", line)
    if m:
        binary = m.group(1)
        continue
    m = re.match(r"test (\S+) \.\.\. (ok|FAILED|ignored)", line)
    if not m or binary is None:
        continue
    name, result = m.groups()
    row_name = binary
    if binary.endswith("/main.rs") and "::" in name:
        row_name = f"{binary} {name.split('::')[0]}"
    if "realcluster" in binary:
        backend = "real"
    elif name.endswith("::genuine"):
        backend = "genuine"
    else:
        backend = "local" if name.endswith("::local") else "other"
    if row_name not in counts:
        counts[row_name] = {}
        order.append(row_name)
    key = (backend, result)
    counts[row_name][key] = counts[row_name].get(key, 0) + 1

print(f"{'test binary (module)':<48} {'local':>6} {'genuine':>8} {'real':>6} {'other':>6}")
total = {"local": 0, "genuine": 0, "real": 0, "other": 0}
for b in order:
    c = counts[b]
    row = {k: sum(v for (bk, r), v in c.items() if bk == k and r == "ok") for k in total}
    for k in total:
        total[k] += row[k]
    print(f"{b:<48} {row['local']:>6} {row['genuine']:>8} {row['real']:>6} {row['other']:>6}")
if skipped:
    print("genuine: every genuine variant returned at once (CCM_TEST_ASSETS unset); the genuine column counts nothing")
if real_skipped:
    print("real: the real-cluster scenarios were skipped (CCM_REALCLUSTER_ASSETS unset); the real column counts nothing")
print(f"{'all':<48} {total['local']:>6} {total['genuine']:>8} {total['real']:>6} {total['other']:>6}")
print(f"{passed} passed, {failed} failed")
