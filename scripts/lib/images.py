#!/usr/bin/env python3
"""Build one container image per shipped binary as a docker-archive .tar, without a Docker daemon.

Each image holds the binary at /<binary>, the shared libraries it links (from `ldd`) and the
dynamic loader, taken from this Debian system; the node plugins' images also hold the tools
mount-utils and the hostpath driver run (mount, mkfs.ext4, e2fsck, ...), and the EBS driver's
image Debian's CA bundle (the controller calls EC2 over HTTPS). Layout follows Debian 12's
merged /usr: files under /usr, with /bin, /sbin, /lib, /lib64 as symlinks into it.

The output is reproducible: every tar entry has mtime SOURCE_DATE_EPOCH (default 0), uid/gid 0,
no user/group names, entries in sorted order, and the config carries only fixed timestamps, so
two builds of the same inputs are byte-identical.

Called by scripts/images; `scripts/images --help` lists the flags.
"""

import argparse
import datetime
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# binary -> cargo package. The names are the ones deploy/kubernetes/** uses: csi-rs/<binary>:v<version>.
IMAGES = {
    "ebs-csi-driver": "ebs-driver",
    "csi-attacher": "attacher",
    "csi-provisioner": "provisioner",
    "csi-node-driver-registrar": "registrar",
    "hostpath-csi-driver": "hostpath-driver",
}

# Cargo flags per image. The EBS driver's default `embedded-ec2` feature links ec2-sim (for
# development, tests and `csictl demo`); a shipped driver must not, so it is built without it, in
# a cargo invocation of its own (--no-default-features would apply to every -p of one call).
CARGO_FLAGS = {
    "ebs-csi-driver": ["--no-default-features"],
}
# Text a binary must hold: the EBS driver's answer to --embedded-ec2 in a build without the
# simulator (ebs_driver::NO_EMBEDDED_EC2), only compiled in when the feature is off. A ship
# binary without it is refused; a dev or release one (`--no-build` from the workspace build,
# as crates/e2e's real_deploy test does) gets a warning.
MUST_CONTAIN = {
    "ebs-csi-driver": b"this build has no embedded EC2 (built without the embedded-ec2 feature)",
}

# What mount-utils execs (mount.rs, blkid.rs, format.rs, fsck.rs, resize.rs), found in PATH.
MOUNT_TOOLS = [
    "mount", "umount", "blkid", "mkfs.ext2", "mkfs.ext3", "mkfs.ext4", "mkfs.xfs", "e2fsck",
    "resize2fs", "xfs_growfs",
]
# mke2fs's defaults (filesystem features per type), as Debian's e2fsprogs sets them.
NODE_CONFIG = ["/etc/mke2fs.conf"]
# The hostpath driver adds loop devices (loopdev.rs) and copies snapshots (backing.rs).
NODE_TOOLS = {
    "ebs-csi-driver": MOUNT_TOOLS,
    "hostpath-csi-driver": MOUNT_TOOLS + ["losetup", "cp"],
}
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
NEEDS_CA = {"ebs-csi-driver"}

TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MERGED_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
# uname -m -> the image config's architecture (OCI/Go names).
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


def die(msg):
    print(f"images: {msg}", file=sys.stderr)
    sys.exit(1)


def workspace_version():
    with open(os.path.join(REPO, "Cargo.toml"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', text, re.M | re.S)
    if not m:
        m = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
    if not m:
        die("Cargo.toml: no workspace version found")
    return m.group(1)


class Layer:
    """Files of one layer, keyed by their path in the image (no leading slash)."""

    def __init__(self):
        self.entries = {}  # path -> ("dir", mode) | ("file", host_path) | ("link", target)

    def add_dir(self, path, mode=0o755):
        path = path.strip("/")
        self._add_parents(path)
        self.entries[path] = ("dir", mode)

    def _add_parents(self, path):
        parent = os.path.dirname(path)
        while parent and parent not in self.entries:
            self.entries[parent] = ("dir", 0o755)
            parent = os.path.dirname(parent)

    def add_file(self, path, host_path):
        path = path.strip("/")
        self._add_parents(path)
        self.entries[path] = ("file", host_path)

    def add_symlink(self, path, target):
        path = path.strip("/")
        self._add_parents(path)
        self.entries[path] = ("link", target)

    def add_host_path(self, host_path):
        """Copy a host path into the image at the same place, keeping the symlinks on the way
        (soname links, mkfs.ext4 -> mke2fs) and putting merged-/usr paths under /usr."""
        seen = set()
        while True:
            if host_path in seen:
                die(f"{host_path}: symlink loop")
            seen.add(host_path)
            directory = os.path.realpath(os.path.dirname(host_path))
            path = os.path.join(directory, os.path.basename(host_path))
            if os.path.islink(path):
                target = os.readlink(path)
                self.add_symlink(path, target)
                host_path = os.path.normpath(os.path.join(directory, target))
                continue
            if not os.path.isfile(path):
                die(f"{path}: not a regular file")
            self.add_file(path, path)
            return

    def tar_bytes(self, mtime):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for path in sorted(self.entries):
                entry = self.entries[path]
                info = tarfile.TarInfo(path)
                info.mtime = mtime
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if entry[0] == "dir":
                    info.type = tarfile.DIRTYPE
                    info.mode = entry[1]
                    tar.addfile(info)
                elif entry[0] == "link":
                    info.type = tarfile.SYMTYPE
                    info.linkname = entry[1]
                    info.mode = 0o777
                    tar.addfile(info)
                else:
                    st = os.stat(entry[1])
                    # Keep the execute bits, drop setuid/setgid (mount, umount): the node
                    # plugins run them as root already.
                    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                    info.size = st.st_size
                    with open(entry[1], "rb") as f:
                        tar.addfile(info, f)
        return buf.getvalue()


def shared_libs(binary):
    """Absolute paths of the shared libraries and loader `ldd` names for an ELF binary."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        if "not a dynamic executable" in out.stdout + out.stderr:
            return []
        die(f"ldd {binary}: {out.stderr.strip()}")
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=> not found" in line:
            die(f"ldd {binary}: {line}")
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"(/\S+)", line)
        if m:
            libs.append(m.group(1))
    return libs


def find_tool(name):
    path = shutil.which(name, path=TOOL_PATH)
    if not path:
        die(f"tool {name} not found in {TOOL_PATH} (install mount, util-linux, e2fsprogs, xfsprogs)")
    return path


def base_layer(binary):
    """Loader, libraries, tools and CA bundle: everything but the binary itself."""
    layer = Layer()
    for link, target in MERGED_USR_LINKS.items():
        layer.add_symlink(link, target)
    layer.add_dir("etc")
    layer.add_dir("tmp", 0o1777)
    layer.add_dir("usr/bin")
    layer.add_dir("usr/sbin")
    for tool in NODE_TOOLS.get(binary, []):
        host = find_tool(tool)
        # Put the tool at /usr/{s,}bin/<tool> even when PATH found it via /sbin.
        layer.add_host_path(host)
        for lib in shared_libs(os.path.realpath(host)):
            layer.add_host_path(lib)
    if binary in NODE_TOOLS:
        for conf in NODE_CONFIG:
            if not os.path.isfile(conf):
                die(f"{conf} missing (apt-get install e2fsprogs)")
            layer.add_host_path(conf)
    if binary in NEEDS_CA:
        if not os.path.isfile(CA_BUNDLE):
            die(f"{CA_BUNDLE} missing (apt-get install ca-certificates)")
        layer.add_host_path(CA_BUNDLE)
    return layer


def check_host():
    """The layout above copies this system's merged /usr; say so when it is not one."""
    for link, target in MERGED_USR_LINKS.items():
        if link == "lib64" and not os.path.lexists("/lib64"):
            continue
        if os.path.realpath("/" + link) != "/" + target:
            die(f"/{link} is not a symlink to /{target}: scripts/images needs a merged-/usr system (Debian 12)")
    machine = platform.machine()
    if machine not in ARCHITECTURES:
        die(f"architecture {machine}: not one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[machine]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def build_image(binary, binary_path, tag, out_dir, mtime, arch):
    base = base_layer(binary)
    for lib in shared_libs(binary_path):
        base.add_host_path(lib)
    app = Layer()
    app.add_file(binary, binary_path)
    layers = [base.tar_bytes(mtime), app.tar_bytes(mtime)]
    diff_ids = ["sha256:" + sha256(b) for b in layers]
    created = "1970-01-01T00:00:00Z" if mtime == 0 else _rfc3339(mtime)
    env = [f"PATH={TOOL_PATH}"]
    if binary in NEEDS_CA:
        env.append(f"SSL_CERT_FILE={CA_BUNDLE}")
    config = {
        "architecture": arch,
        "os": "linux",
        "created": created,
        "config": {"Entrypoint": [f"/{binary}"], "Env": env, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": [
            {"created": created, "created_by": "scripts/images: loader, libraries, tools"},
            {"created": created, "created_by": f"scripts/images: /{binary}"},
        ],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    config_name = sha256(config_bytes) + ".json"
    layer_names = [f"{sha256(b)}/layer.tar" for b in layers]
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": layer_names}]
    repo, _, version = tag.rpartition(":")
    repositories = {repo: {version: sha256(layers[-1])}}

    files = {"manifest.json": json.dumps(manifest, separators=(",", ":")).encode(),
             "repositories": json.dumps(repositories, separators=(",", ":")).encode(),
             config_name: config_bytes}
    for name, data in zip(layer_names, layers):
        files[name] = data
    dirs = {os.path.dirname(n) for n in files if os.path.dirname(n)}

    out_path = os.path.join(out_dir, f"{binary}.tar")
    tmp = out_path + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(set(files) | dirs):
            info = tarfile.TarInfo(name)
            info.mtime = mtime
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if name in dirs:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.mode = 0o644
                info.size = len(files[name])
                tar.addfile(info, io.BytesIO(files[name]))
    os.replace(tmp, out_path)
    return out_path, sha256(config_bytes)


def _rfc3339(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def main():
    p = argparse.ArgumentParser(prog="scripts/images", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for the <binary>.tar files")
    p.add_argument("--profile", default="ship", choices=["dev", "release", "ship"],
                   help="cargo profile of the binaries (default ship)")
    p.add_argument("--no-build", action="store_true", help="use the binaries already built")
    p.add_argument("--only", action="append", choices=sorted(IMAGES), metavar="NAME",
                   help="build only this image (repeatable); names: " + ", ".join(sorted(IMAGES)))
    p.add_argument("--tag-prefix", default="csi-rs/", help="image repository prefix (default csi-rs/)")
    args = p.parse_args()

    names = args.only or list(IMAGES)
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    profile_dir = "debug" if args.profile == "dev" else args.profile
    if not args.no_build:
        # One cargo call per set of flags: the plain ones together, each flagged one alone.
        groups = {}
        for n in names:
            groups.setdefault(tuple(CARGO_FLAGS.get(n, [])), []).append(n)
        for flags, group in sorted(groups.items()):
            cmd = ["cargo", "build", "--profile", args.profile, *flags]
            for n in group:
                cmd += ["-p", IMAGES[n], "--bin", n]
            print("images: " + " ".join(cmd), file=sys.stderr)
            if subprocess.run(cmd, cwd=REPO, check=False).returncode != 0:
                die("cargo build failed")

    epoch = os.environ.get("SOURCE_DATE_EPOCH", "0")
    try:
        mtime = int(epoch)
    except ValueError:
        die(f"SOURCE_DATE_EPOCH={epoch!r}: not an integer")
    arch = check_host()
    version = "v" + workspace_version()
    os.makedirs(args.out, exist_ok=True)
    for n in names:
        binary_path = os.path.join(target, profile_dir, n)
        if not os.path.isfile(binary_path):
            die(f"{binary_path}: not built (drop --no-build, or build with --profile {args.profile})")
        marker = MUST_CONTAIN.get(n)
        if marker is not None:
            with open(binary_path, "rb") as f:
                built_right = marker in f.read()
            if not built_right:
                flags = " ".join(CARGO_FLAGS.get(n, []))
                why = (f"{binary_path} was not built with {flags} (it links the embedded EC2 "
                       f"simulator)")
                # Ship images are the ones that run in real clusters: never with the simulator.
                # A dev or release image from the workspace build (e2e's real_deploy test) may.
                if args.profile == "ship":
                    die(f"{why}: drop --no-build, or build it with "
                        f"`cargo build --profile ship {flags} -p {IMAGES[n]}`")
                print(f"images: warning: {why}; a {args.profile} image for tests only",
                      file=sys.stderr)
        tag = f"{args.tag_prefix}{n}:{version}"
        path, config_digest = build_image(n, binary_path, tag, args.out, mtime, arch)
        size = os.path.getsize(path)
        print(f"{tag}\t{path}\t{size / 1048576:.1f} MiB\tsha256:{config_digest}")


if __name__ == "__main__":
    main()
