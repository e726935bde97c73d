#!/usr/bin/env bash
# Regression guard (issue 50): one short side-by-side on the genuine API server, 1,000 minimal
# Nodes initialized by ours and by the upstream Go CCM, each against the server's own limit
# measured in the same run. It prints the ratios and never fails the build: the numbers are for
# comparing CI runs with each other (debug build of ours, under whatever else the machine runs),
# not with docs/benchmarks.md's release numbers.
# Needs CCM_TEST_ASSETS and ../shared/upstream (or CCM_UPSTREAM); prints one line without them.
set -uo pipefail
cd "$(dirname "$0")/../.."

if [ -z "${CCM_TEST_ASSETS:-}" ] || { [ -z "${CCM_UPSTREAM:-}" ] && [ ! -f ../shared/upstream/upstream-ccm-bench.xz ]; }; then
  echo "regression guard skipped: set CCM_TEST_ASSETS and provide ../shared/upstream (or CCM_UPSTREAM) to run it"
  exit 0
fi
ccm=target/debug/cloud-controller-manager
bench=target/debug/bench-nodes
if [ ! -x "$ccm" ] || [ ! -x "$bench" ]; then
  cargo build -q -p cloud-controller-manager --bin cloud-controller-manager -p e2e --bin bench-nodes || exit 0
fi

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
printf 'autoInstances: true\nlatency: 20ms\n' > "$dir/fake.yaml"
ours="$ccm --cloud-provider=fake --cloud-config=$dir/fake.yaml --kubeconfig={kubeconfig} --controllers=cloud-node \
--leader-elect=false --bind-address=127.0.0.1 --secure-port=18258 --authorization-always-allow-paths=/livez,/metrics --kube-api-qps=0"
upstream="upstream --concurrent-node-syncs=32 --kube-api-qps=5000 --kube-api-burst=5000"
nodes="${CCM_GUARD_NODES:-1000}"

if ! timeout 900 "$bench" --backend genuine --nodes "$nodes" --metrics-url https://127.0.0.1:18258/metrics \
  --timeout-seconds 300 --run "ours=$ours" --run "upstream-best=$upstream" > "$dir/out" 2>&1; then
  echo "regression guard did not finish; its last lines:"
  tail -5 "$dir/out"
  exit 0
fi
# The driver's table: | run | backend | Nodes | time (s) | limit (s) | x limit | ... | peak RSS (MiB) |
grep -E '^\| (run|ours|upstream-best) ' "$dir/out"
awk -F'|' '
  $2 ~ /^ ours / { ot = $5 + 0; ol = $7 + 0; om = $14 + 0 }
  $2 ~ /^ upstream-best / { ut = $5 + 0; ul = $7 + 0; um = $14 + 0 }
  END {
    if (ot > 0 && ut > 0 && um > 0)
      printf "regression guard (%s Nodes, genuine, debug build of ours): ours %.2fx its limit, upstream %.2fx; time ours/upstream %.2f, peak RSS ours/upstream %.2f\n", n, ol, ul, ot / ut, om / um
  }' n="$nodes" "$dir/out"
