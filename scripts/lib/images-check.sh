#!/usr/bin/env bash
# Checks scripts/images on one image (hostpath-csi-driver: a node plugin, so its tools are in
# it), from the binary already built with the dev profile:
#  1. two builds give byte-identical .tar files;
#  2. the image's tag is the one deploy/kubernetes/** names;
#  3. a throwaway containerd (own root, state and socket under a temp dir) imports the .tar, and
#     runs `/hostpath-csi-driver --help` and `/sbin/mkfs.ext4 -V` in it.
# Needs root (containerd) and containerd, ctr, runc. Usage: scripts/lib/images-check.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/csi-rs-target}"
name=hostpath-csi-driver

fail() { echo "images-check: FAIL: $*" >&2; exit 1; }
missing() {
  if [ "${CSI_RS_REQUIRE_ALL:-}" = 1 ]; then fail "$*"; fi
  echo "images-check: skipped: $*" >&2; exit 0
}

[ -x "$CARGO_TARGET_DIR/debug/$name" ] ||
  cargo build -q -p hostpath-driver --bin "$name"
for tool in containerd ctr runc; do command -v "$tool" >/dev/null || missing "$tool not installed"; done
[ "$(id -u)" = 0 ] || missing "not root (containerd needs it)"

tmp=$(mktemp -d /tmp/csi-rs-images-check.XXXXXX)
ctrd_pid=
cleanup() {
  if [ -n "$ctrd_pid" ]; then
    kill "$ctrd_pid" 2>/dev/null || true
    wait "$ctrd_pid" 2>/dev/null || true
  fi
  # Snapshot mounts left by a container that did not finish.
  { grep -o " $tmp/[^ ]*" /proc/self/mountinfo || true; } | sort -r |
    while read -r m; do umount -l "$m" || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

scripts/images --out "$tmp/a" --profile dev --no-build --only "$name" >/dev/null
scripts/images --out "$tmp/b" --profile dev --no-build --only "$name" >/dev/null
cmp "$tmp/a/$name.tar" "$tmp/b/$name.tar" || fail "two builds of $name.tar differ"

tag=$(tar -xOf "$tmp/a/$name.tar" manifest.json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["RepoTags"][0])')
grep -rqF "image: $tag" deploy/kubernetes || fail "tag $tag is not an image deploy/kubernetes names"

mkdir -p "$tmp/ctrd"
cat >"$tmp/ctrd/config.toml" <<EOF
version = 2
root = "$tmp/ctrd/root"
state = "$tmp/ctrd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$tmp/ctrd/sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "$tmp/ctrd/opt"
[plugins."io.containerd.runtime.v2.task"]
  platforms = ["linux/amd64"]
EOF
containerd --config "$tmp/ctrd/config.toml" >"$tmp/ctrd/log" 2>&1 &
ctrd_pid=$!
ctr=(ctr --address "$tmp/ctrd/sock" --namespace images-check)
for _ in $(seq 100); do
  "${ctr[@]}" version >/dev/null 2>&1 && break
  kill -0 "$ctrd_pid" 2>/dev/null || { cat "$tmp/ctrd/log" >&2; fail "containerd exited"; }
  sleep 0.1
done
"${ctr[@]}" images import "$tmp/a/$name.tar" >/dev/null
ref="docker.io/$tag"
"${ctr[@]}" images ls -q | grep -qxF "$ref" || fail "$ref not listed after import"

# Runs a command in the image and checks its output starts a line with $1. Up to 3 tries: ctr
# run now and then returns before copying a short-lived process's output (seen ~1 in 15 here).
run_expect() {
  local want=$1 id=$2 out=
  shift 2
  for _ in 1 2 3; do
    out=$(timeout 60 "${ctr[@]}" run --rm "$ref" "$id" "$@" 2>&1) || fail "$* failed in the image: $out"
    grep -q "^$want" <<<"$out" && return 0
  done
  fail "$* printed no line starting '$want': $out"
}
run_expect 'Usage: ' images-check-help "/$name" --help
run_expect 'mke2fs ' images-check-mkfs /sbin/mkfs.ext4 -V
echo "images-check: $ref reproducible, imported, --help and mkfs.ext4 run"
