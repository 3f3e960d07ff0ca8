# Sourced first by scripts/demo, scripts/test and scripts/setup, which need root (apt-get, loop
# devices, mkfs, mount). As root it does nothing. Otherwise the calling script runs itself
# again through sudo. sudo resets PATH (secure_path), so the caller's PATH is passed on, with
# the sbin directories a user's PATH lacks (losetup, mkfs, modprobe), and the rustup toolchain
# stays found (RUSTUP_HOME too, when it is the caller's ~/.rustup). HOME
# becomes root's (-H): root's build, venv and cargo registry live under /root, so nothing in
# the caller's home ends up owned by root. Without sudo it stops with a clear message.
# shellcheck shell=bash
if [ "$(id -u)" -ne 0 ]; then
  as_root_self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
  as_root_name="$(basename "$0")"
  if ! command -v sudo >/dev/null 2>&1; then
    printf '[%s] needs root (apt-get, loop devices, mkfs, mount) and sudo is not installed:\n' "$as_root_name" >&2
    printf '[%s] run it as root, e.g. su -c %s\n' "$as_root_name" "$as_root_self" >&2
    exit 1
  fi
  as_root_env=("PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin")
  if [ -n "${RUSTUP_HOME:-}" ]; then
    as_root_env+=("RUSTUP_HOME=$RUSTUP_HOME")
  elif [ -d "$HOME/.rustup" ]; then
    as_root_env+=("RUSTUP_HOME=$HOME/.rustup")
  fi
  printf '[%s] not root: running it again through sudo\n' "$as_root_name" >&2
  exec sudo -E -H env "${as_root_env[@]}" "$as_root_self" "$@"
fi
