#!/usr/bin/env python3
"""Build the ccm-operator and cloud-controller-manager images from already-built binaries,
without a registry, a daemon or a builder: one OCI image archive per image, for
`ctr -n k8s.io images import FILE` (containerd 1.6+) or `kind load image-archive FILE`; a
docker-style manifest.json is included for loaders that look for one.

    python3 e2e/realcluster/mkimage.py --bin-dir target/debug --out-dir target/images [--tag dev]

makes OUT_DIR/ccm-operator.tar (localhost/ccm-operator:TAG) and
OUT_DIR/cloud-controller-manager.tar (localhost/cloud-controller-manager:TAG), replacing earlier
ones, and prints one line per image, tab-separated: archive path, image name, manifest digest,
archive size in bytes.

The images follow the repository's Dockerfile, which this script reads rather than repeats:
  * the images are the stages `FROM <runtime> AS <target>`; each one's ENTRYPOINT (exec form),
    CMD, EXPOSE and USER (its own, else the runtime stage's) go into its configuration;
  * the runtime stage must be `FROM gcr.io/distroless/cc-...`; its `COPY --from=<stage>` names
    the binaries (taken by file name from --bin-dir) and where they go (/usr/local/bin/, 0755);
  * what the distroless cc base provides is recreated from the host: /etc/passwd and /etc/group
    with root and nonroot (65532), /etc/nsswitch.conf, /home/nonroot (the working directory),
    /tmp (1777), PATH and SSL_CERT_FILE, the CA bundle at
    /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates), and the ELF interpreter and
    every shared library the binaries load (read from the ELF files, resolved by `ldd`), at the
    paths the loader looks for them. No shell and no other program.
Any other instruction or form in those stages is refused with a message naming its line.

Two layers, shared by both images: the base (everything but the binaries) and the binaries.
Reproducible: entries sorted, owned by 0:0 (but /home/nonroot, 65532:65532, as in distroless),
mtimes SOURCE_DATE_EPOCH or 0, gzip without a timestamp; the same inputs give the same digests.

`mkimage.py generic --name NAME --out FILE [--file SRC:/DEST[:MODE]] [--busybox PATH] ...` makes a
one-layer image from host files instead (the real-cluster tests' pause and web images).

`mkimage.py bird --name NAME --out FILE [--busybox PATH]` makes the Dockerfile's `bird` target
(the BIRD sidecar of spec.announcer.bgp) from the host: that stage must be
`FROM debian:<release>` whose RUN lines `apt-get install` packages; every file those packages
installed on this host (dpkg's list, without documentation and service-manager files) goes in, with the libraries of its
executables, and a static busybox stands in for the Debian base's shell and utilities (the
sidecar's command is `sh -c 'until [ -s ... ]; do sleep 1; done; exec bird ...'`). The stage's
ENTRYPOINT, CMD and USER go into the configuration.

Python 3.11 standard library only.
"""
import argparse
import datetime
import gzip
import hashlib
import io
import json
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PROG = "mkimage.py"
REPO_ROOT = Path(__file__).resolve().parents[2]
NONROOT = 65532

# What gcr.io/distroless/cc-debian12:nonroot provides besides glibc and the CA bundle.
PASSWD = (
    "root:x:0:0:root:/root:/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n"
    "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
)
GROUP = "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n"
NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n"
CA_PATH = "/etc/ssl/certs/ca-certificates.crt"
BASE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", f"SSL_CERT_FILE={CA_PATH}"]
BASE_WORKDIR = "/home/nonroot"

ELF_ARCH = {62: "amd64", 183: "arm64"}


class Refused(Exception):
    """A clear, user-facing reason to stop."""


# ---------------------------------------------------------------------------------------------
# The Dockerfile

class Stage:
    def __init__(self, base, name, line):
        self.base, self.name, self.line, self.instructions = base, name, line, []


def dockerfile_instructions(text, path):
    """(line number, INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out, buf, start = [], None, 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = re.match(r"#\s*escape\s*=\s*(\S)", line)
        if m and not out and buf is None and m.group(1) != "\\":
            raise Refused(f"{path}:{no}: escape character {m.group(1)!r} is not supported")
        if buf is None and (not line or line.startswith("#")):
            continue
        if buf is not None and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if buf is None:
            buf, start = "", no
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, args = buf.partition(" ")
        out.append((start, word.upper(), args.strip()))
        buf = None
    if buf is not None:
        raise Refused(f"{path}:{start}: the instruction continues past the end of the file")
    return out


def parse_dockerfile(path):
    """The runtime stage, its image targets, the binaries it copies and each target's config."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise Refused(f"cannot read the Dockerfile: {e}")
    stages = []
    for no, instr, args in dockerfile_instructions(text, path):
        where = f"{path}:{no}"
        if "<<" in args:
            raise Refused(f"{where}: heredocs are not supported ({instr} {args})")
        if instr == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform=")]
            if len(words) == 1:
                stages.append(Stage(words[0], None, no))
            elif len(words) == 3 and words[1].upper() == "AS":
                stages.append(Stage(words[0], words[2], no))
            else:
                raise Refused(f"{where}: FROM {args!r} is not 'FROM image [AS name]'")
        elif not stages:
            if instr != "ARG":
                raise Refused(f"{where}: {instr} before the first FROM")
        else:
            stages[-1].instructions.append((no, instr, args))

    names = {s.name: s for s in stages if s.name}
    targets = [s for s in stages if s.base in names]
    if not targets:
        raise Refused(f"{path}: no image stages: expected 'FROM <runtime stage> AS <image name>'")
    runtimes = {s.base for s in targets}
    if len(runtimes) != 1:
        raise Refused(f"{path}: the image stages derive from different stages {sorted(runtimes)}; "
                      "expected one shared runtime stage")
    runtime = names[runtimes.pop()]
    if runtime.base in names:
        raise Refused(f"{path}:{runtime.line}: the runtime stage '{runtime.name}' derives from another "
                      f"stage ('{runtime.base}'); expected a distroless cc base image")
    if not re.search(r"(^|/)distroless/cc(-debian\d+)?(:[\w.-]+)?(@sha256:[0-9a-f]+)?$", runtime.base):
        raise Refused(f"{path}:{runtime.line}: the runtime stage's base {runtime.base!r} is not a "
                      "distroless cc image, the only base this script recreates")

    binaries = {}  # path in the image -> file name in --bin-dir
    user = None
    for no, instr, args in runtime.instructions:
        where = f"{path}:{no}"
        if "$" in args:
            raise Refused(f"{where}: variables are not supported here ({instr} {args})")
        if instr == "COPY":
            words = args.split()
            flags = [w for w in words if w.startswith("--")]
            rest = [w for w in words if not w.startswith("--")]
            if len(flags) != 1 or not flags[0].startswith("--from=") or flags[0][7:] not in names:
                raise Refused(f"{where}: only 'COPY --from=<stage> <files...> <dir>/' is supported "
                              f"in the runtime stage, not COPY {args}")
            if args.lstrip().startswith("["):
                raise Refused(f"{where}: the JSON form of COPY is not supported")
            if len(rest) < 2:
                raise Refused(f"{where}: COPY needs a source and a destination")
            *srcs, dest = rest
            if len(srcs) > 1 and not dest.endswith("/"):
                raise Refused(f"{where}: COPY of several files needs a destination ending in '/'")
            if not dest.startswith("/"):
                raise Refused(f"{where}: COPY destination {dest!r} is not absolute")
            for src in srcs:
                if any(c in src for c in "*?["):
                    raise Refused(f"{where}: wildcards are not supported ({src})")
                name = src.rstrip("/").rsplit("/", 1)[-1]
                binaries[dest + name if dest.endswith("/") else dest] = name
        elif instr == "USER":
            user = parse_user(args, where)
        else:
            raise Refused(f"{where}: {instr} in the runtime stage is not supported "
                          "(only COPY --from and USER)")
    if not binaries:
        raise Refused(f"{path}:{runtime.line}: the runtime stage copies no binaries")

    images = {}
    for stage in targets:
        if stage.name is None:
            raise Refused(f"{path}:{stage.line}: an image stage needs a name ('FROM {stage.base} AS <image>')")
        cfg = {"user": user, "entrypoint": None, "cmd": None, "ports": []}
        for no, instr, args in stage.instructions:
            where = f"{path}:{no}"
            if "$" in args:
                raise Refused(f"{where}: variables are not supported here ({instr} {args})")
            if instr in ("ENTRYPOINT", "CMD"):
                try:
                    argv = json.loads(args)
                except ValueError:
                    argv = None
                if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                    raise Refused(f"{where}: {instr} must be the exec (JSON array) form: the image has no "
                                  f"shell for {args!r}")
                cfg[instr.lower()] = argv
            elif instr == "EXPOSE":
                for port in args.split():
                    m = re.fullmatch(r"(\d+)(/(tcp|udp|sctp))?", port)
                    if not m or not 0 < int(m.group(1)) < 65536:
                        raise Refused(f"{where}: EXPOSE {port!r} is not 'PORT' or 'PORT/PROTOCOL'")
                    cfg["ports"].append(f"{int(m.group(1))}/{m.group(3) or 'tcp'}")
            elif instr == "USER":
                cfg["user"] = parse_user(args, where)
            else:
                raise Refused(f"{where}: {instr} in the image stage '{stage.name}' is not supported "
                              "(only ENTRYPOINT, CMD, EXPOSE and USER)")
        if cfg["entrypoint"] is None:
            raise Refused(f"{path}:{stage.line}: the image stage '{stage.name}' has no ENTRYPOINT")
        if cfg["entrypoint"][0] not in binaries:
            raise Refused(f"{path}:{stage.line}: the entrypoint {cfg['entrypoint'][0]} of '{stage.name}' is "
                          f"not one of the copied binaries {sorted(binaries)}")
        if cfg["user"] is None:
            raise Refused(f"{path}:{stage.line}: no USER for '{stage.name}'; the images run as a numeric user")
        if stage.name in images:
            raise Refused(f"{path}:{stage.line}: two image stages named '{stage.name}'")
        images[stage.name] = cfg
    return binaries, images


def parse_user(args, where):
    if not re.fullmatch(r"\d+(:\d+)?", args):
        raise Refused(f"{where}: USER {args!r} is not numeric 'UID[:GID]' (runAsNonRoot needs numbers)")
    return args


# ---------------------------------------------------------------------------------------------
# ELF files and their libraries

def elf_info(path):
    """(architecture, interpreter or None, DT_NEEDED names) of an ELF64 little-endian file."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _elf_info(path, data)
    except (ValueError, struct.error, IndexError, UnicodeDecodeError) as e:
        raise Refused(f"{path} is not a well-formed ELF executable ({e})")


def _elf_info(path, data):
    if data[:4] != b"\x7fELF":
        raise Refused(f"{path} is not an ELF executable")
    if data[4] != 2 or data[5] != 1:
        raise Refused(f"{path}: only 64-bit little-endian ELF files are supported")
    machine, = struct.unpack_from("<H", data, 18)
    if machine not in ELF_ARCH:
        raise Refused(f"{path}: unsupported ELF machine {machine}")
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    interp, dynamic, loads = None, None, []
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 3:  # PT_INTERP
            interp = data[p_offset:p_offset + p_filesz].split(b"\0", 1)[0].decode()
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
        elif p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
    needed, strtab = [], None
    if dynamic:
        entries = []
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            entries.append((tag, val))
        for tag, val in entries:
            if tag == 5:  # DT_STRTAB, an address
                strtab = next((off + val - va for va, off, size in loads if va <= val < va + size), None)
        if strtab is None and any(tag == 1 for tag, _ in entries):
            raise Refused(f"{path}: cannot locate the dynamic string table")
        for tag, val in entries:
            if tag == 1:  # DT_NEEDED, an offset into the string table
                start = strtab + val
                needed.append(data[start:data.find(b"\0", start)].decode())
    return ELF_ARCH[machine], interp, needed


def shared_libraries(binary, interp, needed):
    """Every library the loader maps for `binary`, as {path the loader opens: host file}."""
    libs = {interp: interp}
    if not needed:
        return libs
    if shutil.which("ldd") is None:
        raise Refused(f"{binary} is dynamically linked and `ldd` (libc-bin) is missing to resolve {needed}")
    run = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if run.returncode != 0:
        raise Refused(f"ldd {binary} failed: {(run.stdout + run.stderr).strip()}")
    names = set()
    for line in run.stdout.splitlines():
        line = line.strip()
        m = re.fullmatch(r"(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?", line)
        if m:
            if m.group(2) == "not found":
                raise Refused(f"{binary} needs {m.group(1)}, which is not installed on this host")
            names.add(m.group(1))
            path = m.group(2)
        else:
            m = re.fullmatch(r"(\S+) \(0x[0-9a-f]+\)", line)
            if not m:
                raise Refused(f"unexpected ldd output for {binary}: {line!r}")
            path = m.group(1)
            if "/" not in path:
                continue  # the vDSO, provided by the kernel
            # The loader itself, which Rust binaries also list as NEEDED (ld-linux-x86-64.so.2).
            names.add(os.path.basename(path))
        libs[path] = path
    missing = sorted(set(needed) - names)
    if missing:
        raise Refused(f"ldd did not resolve {missing} of {binary}")
    # The image has no /etc/ld.so.cache: the loader finds libraries only in its built-in
    # directories (and their glibc-hwcaps subdirectories).
    system = loader_search_path(interp)
    for path in libs:
        parent = os.path.dirname(path)
        if path != interp and system and not any(
                parent == d or parent.startswith(d + "/glibc-hwcaps/") for d in system):
            raise Refused(f"{binary} loads {path}, outside the loader's built-in search path {system}; "
                          "without an ld.so.cache the image could not find it")
    return libs


def loader_search_path(interp):
    """The directories `interp --help` lists as its system search path (glibc 2.33+), or []."""
    try:
        run = subprocess.run([interp, "--help"], capture_output=True, text=True, timeout=30)
    except OSError:
        return []
    return re.findall(r"^\s+(/\S*) \(system search path\)$", run.stdout, re.M)


# ---------------------------------------------------------------------------------------------
# Layers and archives

class Digesting:
    """A write-only stream that hashes and counts what passes through to `sink` (or nowhere)."""

    def __init__(self, sink=None):
        self.sink, self.sha, self.size = sink, hashlib.sha256(), 0

    def write(self, b):
        self.sha.update(b)
        self.size += len(b)
        if self.sink is not None:
            self.sink.write(b)
        return len(b)

    def tell(self):
        return self.size

    def flush(self):
        pass

    def digest(self):
        return "sha256:" + self.sha.hexdigest()


class Entry:
    """One file system entry of a layer: a directory, a symlink, a host file or inline bytes."""

    def __init__(self, path, kind, mode, uid=0, gid=0, source=None, data=None, link=None):
        self.path, self.kind, self.mode, self.uid, self.gid = path.strip("/"), kind, mode, uid, gid
        self.source, self.data, self.link = source, data, link


def with_parents(entries):
    """The entries plus every missing parent directory (0755, root), sorted parents first."""
    by_path = {}
    for e in entries:
        if not e.path or ".." in e.path.split("/"):
            raise Refused(f"bad path in the image: /{e.path}")
        if e.path in by_path:
            raise Refused(f"/{e.path} is added twice")
        by_path[e.path] = e
    for e in entries:
        parts = e.path.split("/")
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            existing = by_path.get(parent)
            if existing is None:
                by_path[parent] = Entry(parent, "dir", 0o755)
            elif existing.kind != "dir":
                raise Refused(f"/{parent} is both a file and the directory of /{e.path}")
    return sorted(by_path.values(), key=lambda e: e.path.split("/"))


def write_layer(entries, blob_dir, mtime):
    """Write a gzip-compressed layer blob; return (descriptor, diff_id)."""
    tmp = tempfile.NamedTemporaryFile(dir=blob_dir, prefix=".layer-", delete=False)
    try:
        with tmp:
            compressed = Digesting(tmp)
            with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, compresslevel=6, mtime=0) as gz:
                raw = Digesting(gz)
                with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
                    for e in with_parents(entries):
                        ti = tarfile.TarInfo(e.path)
                        ti.mode, ti.uid, ti.gid, ti.mtime = e.mode, e.uid, e.gid, mtime
                        ti.uname = ti.gname = ""
                        if e.kind == "dir":
                            ti.type = tarfile.DIRTYPE
                            tf.addfile(ti)
                        elif e.kind == "symlink":
                            ti.type, ti.linkname = tarfile.SYMTYPE, e.link
                            tf.addfile(ti)
                        elif e.data is not None:
                            ti.size = len(e.data)
                            tf.addfile(ti, io.BytesIO(e.data))
                        else:
                            ti.size = os.stat(e.source).st_size
                            with open(e.source, "rb") as f:
                                tf.addfile(ti, f)
        digest = compressed.digest()
        os.replace(tmp.name, blob_dir / digest[7:])
    except BaseException:
        os.unlink(tmp.name)
        raise
    desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": compressed.size}
    return desc, raw.digest()


def put_json(blob_dir, obj, media_type):
    data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (blob_dir / digest[7:]).write_bytes(data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def write_archive(out, members, mtime):
    """An uncompressed tar of (name, bytes or host path) members, in name order."""
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tf:
        dirs = sorted({"/".join(n.split("/")[:i]) for n, _ in members for i in range(1, n.count("/") + 1)})
        for d in dirs:
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, mtime
            tf.addfile(ti)
        for name, content in sorted(members):
            ti = tarfile.TarInfo(name)
            ti.mode, ti.mtime = 0o644, mtime
            if isinstance(content, bytes):
                ti.size = len(content)
                tf.addfile(ti, io.BytesIO(content))
            else:
                ti.size = os.stat(content).st_size
                with open(content, "rb") as f:
                    tf.addfile(ti, f)
    os.replace(tmp, out)


def write_image(out, name, arch, config, layers, history, blob_dir, mtime):
    """One image as an OCI archive at `out` (plus docker's manifest.json); its manifest digest.

    `layers` are (descriptor, diff_id) pairs whose blobs are in `blob_dir`."""
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    created = history[-1]["created"]
    image_config = {
        "architecture": arch, "os": "linux", "created": created, "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id in layers]},
        "history": history,
    }
    config_desc = put_json(blob_dir, image_config, "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc, "layers": [desc for desc, _ in layers],
    }
    manifest_desc = put_json(blob_dir, manifest, "application/vnd.oci.image.manifest.v1+json")
    index = {
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        # containerd names the image after io.containerd.image.name; the OCI ref name is the tag.
        "manifests": [dict(manifest_desc, platform={"architecture": arch, "os": "linux"},
                           annotations={"io.containerd.image.name": name,
                                        "org.opencontainers.image.ref.name": tag})],
    }
    blobs = [manifest_desc, config_desc] + [desc for desc, _ in layers]
    members = [(f"blobs/sha256/{d['digest'][7:]}", blob_dir / d["digest"][7:]) for d in blobs]
    members += [
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
        ("index.json", json.dumps(index, sort_keys=True, separators=(",", ":")).encode()),
        # docker-archive's manifest, for loaders that look for it rather than index.json.
        ("manifest.json", json.dumps([{
            "Config": f"blobs/sha256/{config_desc['digest'][7:]}",
            "RepoTags": [name],
            "Layers": [f"blobs/sha256/{desc['digest'][7:]}" for desc, _ in layers],
        }], separators=(",", ":")).encode()),
    ]
    write_archive(out, members, mtime)
    return manifest_desc["digest"]


def source_date():
    """(mtime, RFC 3339 time) from SOURCE_DATE_EPOCH, or the epoch."""
    raw = os.environ.get("SOURCE_DATE_EPOCH") or "0"
    if not raw.isdigit():
        raise Refused(f"SOURCE_DATE_EPOCH={raw!r} is not a number of seconds")
    mtime = int(raw)
    return mtime, datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_libraries(host, image_path, mode, libs, archs, require_elf=False):
    """The entry for a host file; an ELF executable adds its architecture and libraries."""
    with open(host, "rb") as f:
        is_elf = f.read(4) == b"\x7fELF"
    if is_elf or require_elf:
        arch, interp, needed = elf_info(host)
        archs.add(arch)
        if interp:
            libs.update(shared_libraries(host, interp, needed))
    return Entry(image_path, "file", mode, source=host)


def library_entries(libs):
    """Each library as a regular file at the path the loader opens (host symlinks resolved)."""
    out = []
    for path, host in sorted(libs.items()):
        real = os.path.realpath(host)
        out.append(Entry(path, "file", os.stat(real).st_mode & 0o755, source=real))
    return out


def one_arch(archs):
    if len(archs) > 1:
        raise Refused(f"the executables are for different architectures: {sorted(archs)}")
    if archs:
        return archs.pop()
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def build(args):
    """The Dockerfile's images from the binaries in --bin-dir."""
    binaries, images = parse_dockerfile(args.dockerfile)
    bin_dir = Path(args.bin_dir)
    mtime, created = source_date()
    if not re.fullmatch(r"\w[\w.-]{0,127}", args.tag):
        raise Refused(f"--tag {args.tag!r} is not a valid image tag")

    app, libs, archs = [], {}, set()
    for image_path, name in sorted(binaries.items()):
        host = bin_dir / name
        if not host.is_file():
            raise Refused(f"{host} is missing: the Dockerfile copies '{name}' to {image_path} "
                          "(build it first, e.g. cargo build --bin ccm-operator --bin cloud-controller-manager)")
        app.append(with_libraries(host, image_path, 0o755, libs, archs, require_elf=True))
    arch = one_arch(archs)

    ca = Path(args.ca_bundle)
    if not ca.is_file():
        raise Refused(f"no CA bundle at {ca} (install Debian's ca-certificates, or pass --ca-bundle)")
    base = [
        Entry("etc/passwd", "file", 0o644, data=PASSWD.encode()),
        Entry("etc/group", "file", 0o644, data=GROUP.encode()),
        Entry("etc/nsswitch.conf", "file", 0o644, data=NSSWITCH.encode()),
        Entry(CA_PATH, "file", 0o644, source=ca),
        Entry("home/nonroot", "dir", 0o700, uid=NONROOT, gid=NONROOT),
        Entry("root", "dir", 0o700),
        Entry("tmp", "dir", 0o1777),
    ] + library_entries(libs)

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".mkimage-") as work:
        blob_dir = Path(work)
        layers = [write_layer(base, blob_dir, mtime), write_layer(app, blob_dir, mtime)]
        history = [
            {"created": created, "created_by": f"{PROG}: distroless cc base recreated from the host "
                                               "(passwd, group, CA certificates, glibc)"},
            {"created": created, "created_by": f"{PROG}: COPY " + " ".join(sorted(binaries)) + " (0755)"},
        ]
        for target, cfg in sorted(images.items()):
            config = {
                "User": cfg["user"],
                "Env": BASE_ENV,
                "WorkingDir": BASE_WORKDIR,
                "Entrypoint": cfg["entrypoint"],
                "Labels": {"org.opencontainers.image.title": target},
            }
            if cfg["cmd"]:
                config["Cmd"] = cfg["cmd"]
            if cfg["ports"]:
                config["ExposedPorts"] = {p: {} for p in cfg["ports"]}
            name = f"{args.repository_prefix}{target}:{args.tag}"
            out = out_dir / f"{target}.tar"
            digest = write_image(out, name, arch, config, layers, history, blob_dir, mtime)
            results.append((out, name, digest, out.stat().st_size))
    return results


def build_generic(args):
    """A one-layer image from host files (test images: the Pod sandbox, a web server)."""
    mtime, created = source_date()
    entries = [
        Entry("etc/passwd", "file", 0o644, data=PASSWD.encode()),
        Entry("etc/group", "file", 0o644, data=GROUP.encode()),
        Entry("tmp", "dir", 0o1777),
    ]
    libs, archs = {}, set()
    if args.busybox:
        entries.append(with_libraries(args.busybox, "bin/busybox", 0o755, libs, archs))
        run = subprocess.run([args.busybox, "--list"], capture_output=True, text=True)
        if run.returncode != 0:
            raise Refused(f"{args.busybox} --list failed: {run.stderr.strip()}")
        entries += [Entry(f"bin/{applet}", "symlink", 0o777, link="busybox")
                    for applet in sorted(set(run.stdout.split()) - {"busybox"})]
    for spec in args.file:
        src, sep, rest = spec.partition(":")
        dest, _, mode = rest.partition(":")
        if not sep or not dest.startswith("/"):
            raise Refused(f"--file {spec!r} is not SRC:/DEST[:MODE]")
        if not os.path.isfile(src):
            raise Refused(f"--file {spec!r}: no file {src}")
        mode = int(mode, 8) if mode else os.stat(src).st_mode & 0o7777
        entries.append(with_libraries(src, dest, mode, libs, archs))
    entries += [e for e in library_entries(libs) if e.path not in {x.path for x in entries}]
    arch = one_arch(archs)
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + args.env}
    for key, value in (("Entrypoint", args.entrypoint), ("Cmd", args.cmd)):
        if value:
            try:
                argv = json.loads(value)
            except ValueError:
                argv = None
            if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
                raise Refused(f"--{key.lower()} {value!r} is not a JSON array of strings")
            config[key] = argv
    if args.user:
        config["User"] = parse_user(args.user, "--user")
    if args.port:
        config["ExposedPorts"] = {p if "/" in p else f"{p}/tcp": {} for p in args.port}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".mkimage-") as work:
        layers = [write_layer(entries, Path(work), mtime)]
        history = [{"created": created, "created_by": f"{PROG} generic"}]
        digest = write_image(out, args.name, arch, config, layers, history, Path(work), mtime)
    return [(out, args.name, digest, out.stat().st_size)]


# ---------------------------------------------------------------------------------------------
# The Dockerfile's `bird` target, from the host's Debian packages

# Documentation, and the host's service manager's files (a container has no init to read them).
LEFT_OUT = ("usr/share/doc/", "usr/share/man/", "usr/share/lintian/", "usr/share/bug/", "lib/systemd/",
            "usr/lib/systemd/", "etc/init.d/")


def parse_package_stage(path, target):
    """(packages, config) of the stage `target`: `FROM debian:...`, RUN lines installing
    packages with apt-get, and ENTRYPOINT, CMD or USER."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise Refused(f"cannot read the Dockerfile: {e}")
    stage, found = None, False
    packages, cfg = [], {"user": None, "entrypoint": None, "cmd": None}
    for no, instr, args in dockerfile_instructions(text, path):
        where = f"{path}:{no}"
        if instr == "FROM":
            words = [w for w in args.split() if not w.startswith("--platform=")]
            stage = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            if stage == target:
                found = True
                if not re.fullmatch(r"(docker\.io/)?(library/)?debian:[\w.-]+", words[0]):
                    raise Refused(f"{where}: the '{target}' stage's base {words[0]!r} is not a Debian image, "
                                  "whose packages this script takes from the host")
            continue
        if stage != target:
            continue
        if instr == "RUN":
            for command in re.split(r"&&|;|\|\|", args):
                words = command.split()
                if words[:2] == ["apt-get", "install"]:
                    packages += [w for w in words[2:] if not w.startswith("-")]
        elif instr in ("ENTRYPOINT", "CMD"):
            try:
                argv = json.loads(args)
            except ValueError:
                argv = None
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                raise Refused(f"{where}: {instr} must be the exec (JSON array) form, not {args!r}")
            cfg[instr.lower()] = argv
        elif instr == "USER":
            cfg["user"] = parse_user(args, where)
        else:
            raise Refused(f"{where}: {instr} in the '{target}' stage is not supported "
                          "(only RUN apt-get install, ENTRYPOINT, CMD and USER)")
    if not found:
        raise Refused(f"{path}: no stage 'FROM debian:... AS {target}'")
    if not packages:
        raise Refused(f"{path}: the '{target}' stage installs no package with apt-get install")
    return packages, cfg


def package_files(package):
    """The regular files and symlinks the installed Debian `package` holds, without documentation
    and service-manager files."""
    if shutil.which("dpkg-query") is None:
        raise Refused(f"dpkg-query is missing: the image takes {package}'s files from an installed Debian package")
    status = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", package], capture_output=True, text=True)
    if status.returncode != 0 or status.stdout.strip() != "installed":
        raise Refused(f"the Debian package {package} is not installed on this host (apt-get install {package})")
    listed = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
    if listed.returncode != 0:
        raise Refused(f"dpkg-query -L {package} failed: {listed.stderr.strip()}")
    out = []
    for path in listed.stdout.splitlines():
        rel = path.strip().lstrip("/")
        # Directories (also a merged-/usr host's /lib, a link to one) are made as parents.
        if not rel or rel.startswith(LEFT_OUT) or os.path.isdir(path) or not os.path.lexists(path):
            continue
        out.append(path.strip())
    if not out:
        raise Refused(f"the package {package} holds no file")
    return out


def build_bird(args):
    """The Dockerfile's `bird` target from the host's packages and a static busybox."""
    packages, cfg = parse_package_stage(args.dockerfile, args.target)
    mtime, created = source_date()
    entries = [
        Entry("etc/passwd", "file", 0o644, data=PASSWD.encode()),
        Entry("etc/group", "file", 0o644, data=GROUP.encode()),
        Entry("tmp", "dir", 0o1777),
        Entry("run", "dir", 0o755),
    ]
    libs, archs, taken = {}, set(), set()
    if not os.path.isfile(args.busybox):
        raise Refused(f"no busybox at {args.busybox} (the image's shell)")
    with open(args.busybox, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise Refused(f"{args.busybox} is not an executable")
    arch, interp, _ = elf_info(args.busybox)
    if interp:
        raise Refused(f"{args.busybox} is dynamically linked; the image's shell must be a static busybox")
    archs.add(arch)
    entries.append(Entry("bin/busybox", "file", 0o755, source=args.busybox))
    run = subprocess.run([args.busybox, "--list"], capture_output=True, text=True)
    if run.returncode != 0:
        raise Refused(f"{args.busybox} --list failed: {run.stderr.strip()}")
    applets = sorted(set(run.stdout.split()) - {"busybox"})
    for package in packages:
        for path in package_files(package):
            rel = path.lstrip("/")
            taken.add(rel)
            if os.path.islink(path):
                entries.append(Entry(rel, "symlink", 0o777, link=os.readlink(path)))
            else:
                entries.append(with_libraries(path, rel, os.stat(path).st_mode & 0o7777, libs, archs))
    entries += [Entry(f"bin/{a}", "symlink", 0o777, link="busybox") for a in applets if f"bin/{a}" not in taken]
    entries += [e for e in library_entries(libs) if e.path not in {x.path for x in entries}]
    arch = one_arch(archs)
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
              "Labels": {"org.opencontainers.image.title": args.target}}
    for key in ("entrypoint", "cmd"):
        if cfg[key]:
            config[key.capitalize()] = cfg[key]
    if cfg["user"]:
        config["User"] = cfg["user"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".mkimage-") as work:
        layers = [write_layer(entries, Path(work), mtime)]
        history = [{"created": created, "created_by": f"{PROG} bird: the host's {' '.join(packages)} "
                                                      "and a static busybox as the shell"}]
        digest = write_image(out, args.name, arch, config, layers, history, Path(work), mtime)
    return [(out, args.name, digest, out.stat().st_size)]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bird"]:
        ap = argparse.ArgumentParser(prog=f"{PROG} bird",
                                     description="The Dockerfile's bird target from the host's Debian packages.")
        ap.add_argument("--name", required=True, help="image name, e.g. localhost/bird:dev")
        ap.add_argument("--out", required=True, help="the archive to write")
        ap.add_argument("--busybox", default="/bin/busybox", help="a static busybox: the shell and utilities")
        ap.add_argument("--target", default="bird", help="the Dockerfile stage (default: bird)")
        ap.add_argument("--dockerfile", default=str(REPO_ROOT / "Dockerfile"),
                        help="the Dockerfile to follow (default: the repository's)")
        args, run = ap.parse_args(argv[1:]), build_bird
    elif argv[:1] == ["generic"]:
        ap = argparse.ArgumentParser(prog=f"{PROG} generic",
                                     description="A one-layer image from host files (for test images). "
                                                 "Dynamic ELF executables get their libraries.")
        ap.add_argument("--name", required=True, help="image name, e.g. localhost/pause:dev")
        ap.add_argument("--out", required=True, help="the archive to write")
        ap.add_argument("--file", action="append", default=[], metavar="SRC:/DEST[:MODE]")
        ap.add_argument("--busybox", metavar="PATH", help="as /bin/busybox, with a /bin symlink per applet")
        ap.add_argument("--entrypoint", metavar="JSON")
        ap.add_argument("--cmd", metavar="JSON")
        ap.add_argument("--env", action="append", default=[], metavar="K=V")
        ap.add_argument("--user", metavar="UID[:GID]")
        ap.add_argument("--port", action="append", default=[])
        args, run = ap.parse_args(argv[1:]), build_generic
    else:
        ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     epilog=f"`{PROG} generic --help`: a one-layer image from host files.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--bin-dir", required=True,
                        help="holds the binaries the Dockerfile copies (e.g. target/release)")
        ap.add_argument("--out-dir", required=True, help="where the archives go (created if missing)")
        ap.add_argument("--tag", default="dev", help="image tag (default: dev)")
        ap.add_argument("--repository-prefix", default="localhost/",
                        help="prepended to each Dockerfile target name (default: localhost/)")
        ap.add_argument("--dockerfile", default=str(REPO_ROOT / "Dockerfile"),
                        help="the Dockerfile to follow (default: the repository's)")
        ap.add_argument("--ca-bundle", default=CA_PATH, help=f"the host's CA bundle (default: {CA_PATH})")
        args, run = ap.parse_args(argv), build
    try:
        results = run(args)
    except Refused as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    for out, name, digest, size in results:
        print(f"{out}\t{name}\t{digest}\t{size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
