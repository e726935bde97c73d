#!/usr/bin/env bash
# Prepares the real-cluster assets: the Debian packages the node needs (containerd, runc, the
# CNI plugins, iptables, iproute2, a static busybox for the test web server, curl for
# in-cluster requests, BIRD 2 for the three-Node runs' router), the Kubernetes
# node and controller binaries unpacked from ../shared/realcluster (each checked against its
# SHA256SUMS), and etcd and kube-apiserver from the genuine backend's assets. Prints the
# directory to use as CCM_REALCLUSTER_ASSETS. Needs root (apt-get).
#
#   export CCM_REALCLUSTER_ASSETS="$(bash e2e/realcluster/setup.sh)"
set -euo pipefail
cd "$(dirname "$0")/../.."

kit="${CCM_REALCLUSTER_KIT:-../shared/realcluster}"
dir="${CCM_REALCLUSTER_ASSETS_DIR:-$PWD/target/realcluster-assets}"
[ -d "$kit/bin" ] || { echo "no real-cluster kit at $kit (set CCM_REALCLUSTER_KIT)" >&2; exit 1; }
mkdir -p "$dir"

# Debian packages, installed only when missing; `apt-get update` only if the install fails.
missing=()
command -v containerd >/dev/null && command -v ctr >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[ -x /usr/lib/cni/bridge ] || [ -x /opt/cni/bin/bridge ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
command -v conntrack >/dev/null || missing+=(conntrack)
command -v ip >/dev/null || missing+=(iproute2)
[ -x /bin/busybox ] || missing+=(busybox-static)
command -v curl >/dev/null || missing+=(curl)
command -v bird >/dev/null || missing+=(bird2)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
    || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; }
fi
# Debian's containerd package starts its own service on systemd hosts; the harness runs its own
# instance with its own socket and root, so the two do not meet.

# The kit's binaries, unpacked with Python's lzma (no xz needed) when missing or changed.
python3 - "$kit/bin" "$dir" <<'PY' >&2
import hashlib, lzma, os, sys
src, dst = sys.argv[1], sys.argv[2]
sums = dict(reversed(l.split()) for l in open(os.path.join(src, "SHA256SUMS")) if l.strip())
for packed in sorted(os.listdir(src)):
    if not packed.endswith(".xz"):
        continue
    name = packed[:-3]
    out = os.path.join(dst, name)
    stamp = os.path.join(dst, f".{name}.sha256")
    want = sums.get(name) or sums.get("*" + name)
    if os.path.isfile(out) and os.path.isfile(stamp) and open(stamp).read() == want:
        continue
    digest = hashlib.sha256()
    with lzma.open(os.path.join(src, packed)) as f, open(out + ".tmp", "wb") as o:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            o.write(chunk)
    if want and digest.hexdigest() != want:
        os.unlink(out + ".tmp")
        sys.exit(f"{packed}: sha256 {digest.hexdigest()} does not match SHA256SUMS ({want})")
    os.chmod(out + ".tmp", 0o755)
    os.replace(out + ".tmp", out)
    open(stamp, "w").write(want or "")
    print(f"unpacked {name}")
PY

# etcd and kube-apiserver: the genuine backend's.
genuine="${CCM_TEST_ASSETS:-$(bash e2e/envtest/setup.sh)}"
ln -sf "$genuine/etcd" "$dir/etcd"
ln -sf "$genuine/kube-apiserver" "$dir/kube-apiserver"
"$dir/kubelet" --version >&2
echo "$dir"
