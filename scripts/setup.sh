#!/usr/bin/env bash
# One-time (idempotent) set-up shared by the README's two commands and by CI:
#   1. a virtualenv in .venv with the pinned packages and t1jax itself (pip install -e .),
#   2. a running Docker engine (Debian's docker.io, started with no bridge network), or bubblewrap,
#   3. the sandbox base images t1jax/base:bookworm, :trixie and :noble (Ubuntu 24.04), built
#      offline-style with debootstrap,
#   4. headless Chromium (Debian's chromium), which tests/report/test_report.py renders the trajectory
#      viewer with.
# Each step says clearly what failed and what to do. Set T1JAX_SKIP_DOCKER=1 to use bubblewrap only.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE_IMAGE=${T1JAX_BASE_IMAGE:-t1jax/base:bookworm}
BASE_PACKAGES=python3,python-is-python3,python3-pytest,python3-pip,python3-venv,python3-setuptools,procps,psmisc,git,sqlite3,jq,make,gcc,libc6-dev,patch,file,bzip2,xz-utils,zip,unzip,gawk,bc,tree,less,ca-certificates
TRIXIE_IMAGE=t1jax/base:trixie
TRIXIE_PACKAGES=python3,python-is-python3,python3-pytest,python3-pip,python3-venv,procps,git,ca-certificates
NOBLE_IMAGE=t1jax/base:noble  # Ubuntu 24.04 (Python 3.12) with bookworm's tools, for ubuntu:24.04
NOBLE_PACKAGES=$BASE_PACKAGES
# Images and root filesystems are rebuilt when their package list changes (label/stamp differ).
log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31m[setup] ERROR:\033[0m %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else return 1; fi; }

# --- 1. Python environment -------------------------------------------------------------------
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || die "python3 not found; install Python 3.11+ and re-run."
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "Python 3.11+ required ($("$PY" --version))."
if [ ! -x .venv/bin/python ]; then
  log "creating virtualenv .venv"
  "$PY" -m venv .venv || die "python3 -m venv failed; install the venv module (apt-get install python3-venv)."
fi
STAMP=.venv/.requirements.sha256
# editable: `import t1jax` and `import configs` from any folder, read from this checkout
install_self() {
  .venv/bin/python -m pip install -q --no-deps -e . 2>/dev/null \
    || die "pip install -e . failed; run .venv/bin/python -m pip install -e . to see why."
}
WANT=$(cat requirements.txt requirements-test.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  log "installing pinned packages (requirements.txt, requirements-test.txt) and t1jax itself (pip install -e .)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r requirements.txt -r requirements-test.txt \
    || die "pip install failed (see above); the package index must be reachable."
  install_self
  echo "$WANT" > "$STAMP"
fi
# a checkout moved or copied elsewhere: its .venv still points at the old one
.venv/bin/python -c 'import sys, t1jax; from pathlib import Path; sys.exit(Path(t1jax.__file__).resolve().parents[1] != Path.cwd().resolve())' 2>/dev/null \
  || install_self

# --- 2. Sandbox engine ------------------------------------------------------------------------
apt_install() {  # then drop the downloaded .debs: CI machines can be short of disk
  command -v apt-get >/dev/null || return 1
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null &&
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null &&
    { as_root apt-get clean || true; }
}
docker_ok() { docker info >/dev/null 2>&1; }
need_bwrap() {
  command -v bwrap >/dev/null || apt_install bubblewrap ||
    die "neither Docker nor bubblewrap is available; install docker.io or bubblewrap and re-run."
}

# gVisor (runsc), registered as a Docker runtime for sandbox.runtime="runsc". runtimeArgs
# --network=none: with no bridge, runsc cannot start a container in the root network namespace.
T1JAX_DIR=/var/lib/t1jax
# Debian 12's own runsc (20221219) rejects statx(AT_NO_AUTOMOUNT) with EINVAL, so bookworm's
# coreutils `ls -l` and `stat` fail inside it; bookworm-backports has a 2024 build that works.
runsc_date() { runsc --version 2>/dev/null | grep -o '[0-9]\{8\}' | head -1; }
register_runsc() {
  if [ "$(runsc_date || true)" \< 20230101 ]; then
    log "installing gVisor (runsc) for sandbox.runtime=runsc"
    if grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
      echo "deb http://deb.debian.org/debian bookworm-backports main" |
        as_root tee /etc/apt/sources.list.d/t1jax-bookworm-backports.list >/dev/null
      apt_install -t bookworm-backports runsc || true
    else
      apt_install runsc || true
    fi
  fi
  [ "$(runsc_date || true)" \> 20230101 ] || {
    log "WARNING: no gVisor (runsc) from 2023 or later; sandbox.runtime=runsc will be unavailable"; return 1; }
  printf '{"runtimes": {"runsc": {"path": "%s", "runtimeArgs": ["--network=none", "--overlay2=none"]}}}\n' \
    "$(command -v runsc)" > "$T1JAX_DIR/daemon.json"
}
# Docker's overlay2 driver enforces `--storage-opt size` only on XFS with project quotas, which
# this kernel lacks; its btrfs driver enforces it with qgroups. T1JAX_STORAGE_QUOTA=1 makes the
# daemon we start keep its data on a loop-mounted btrfs file (sparse: it takes only what is used).
# Off by default: a sandbox's life cycle is about 5x slower on it (BENCHMARKS.md). The storage
# tests start their own btrfs daemon, so btrfs-progs is installed either way.
prepare_btrfs_root() {
  local image=$T1JAX_DIR/docker.btrfs root=$T1JAX_DIR/docker-btrfs
  mkdir -p "$root"
  mountpoint -q "$root" && return 0
  grep -qw btrfs /proc/filesystems || modprobe btrfs 2>/dev/null || return 1
  command -v mkfs.btrfs >/dev/null || apt_install btrfs-progs || return 1
  if [ ! -f "$image" ]; then
    local free_gb; free_gb=$(( $(df --output=avail -k "$T1JAX_DIR" | tail -1) / 1048576 ))
    local size_gb=$(( free_gb * 8 / 10 )); [ "$size_gb" -gt 200 ] && size_gb=200
    [ "$size_gb" -ge 8 ] || { log "WARNING: under 10 GB free for the btrfs data-root"; return 1; }
    truncate -s "${size_gb}G" "$image" && mkfs.btrfs -q -f "$image" >/dev/null ||
      { rm -f "$image"; return 1; }
  fi
  mount -o loop "$image" "$root" 2>/dev/null || return 1
  btrfs quota enable "$root"
}

if [ "${T1JAX_SKIP_DOCKER:-0}" = 1 ]; then
  log "T1JAX_SKIP_DOCKER=1: using the bubblewrap sandbox"; need_bwrap
elif docker_ok; then
  log "Docker engine is running"
else
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    log "installing Debian's docker.io, debootstrap and bubblewrap"
    apt_install docker.io debootstrap bubblewrap ||
      die "could not install docker.io (needs root and apt). Install Docker yourself, or set T1JAX_SKIP_DOCKER=1 to use bubblewrap."
  fi
  if [ "$(id -u)" = 0 ]; then
    mkdir -p "$T1JAX_DIR"
    args=(--bridge=none --iptables=false --ip-masq=false)
    if register_runsc; then args+=(--config-file "$T1JAX_DIR/daemon.json"); fi
    if [ "${T1JAX_STORAGE_QUOTA:-0}" = 1 ]; then
      if prepare_btrfs_root; then
        args+=(--data-root "$T1JAX_DIR/docker-btrfs" --storage-driver btrfs)
      else
        log "WARNING: no btrfs data-root (needs loop devices and btrfs): storage quotas fall back to the watchdog (see BUILD.md, Sandbox security)"
      fi
    fi
    log "starting dockerd ${args[*]} (no bridge: sandboxes get no network)"
    nohup dockerd "${args[@]}" >/var/log/t1jax-dockerd.log 2>&1 &
    echo $! > /var/lib/t1jax/dockerd.pid
    for _ in $(seq 60); do docker_ok && break; sleep 0.5; done
    docker_ok || die "dockerd did not start; see /var/log/t1jax-dockerd.log"
  else
    die "Docker is installed but not running and we are not root. Start it (sudo systemctl start docker, or sudo dockerd --bridge=none --iptables=false &) and add yourself to the docker group, or set T1JAX_SKIP_DOCKER=1 for bubblewrap."
  fi
fi

if [ "${T1JAX_SKIP_DOCKER:-0}" != 1 ] && ! command -v mkfs.btrfs >/dev/null; then
  log "installing btrfs-progs (the kernel storage-quota tests run a btrfs Docker daemon)"
  apt_install btrfs-progs || log "WARNING: could not install btrfs-progs; the kernel storage-quota tests will not run"
fi

# --- 3. Sandbox base images / rootfs ----------------------------------------------------------
# Stand-ins for the public bases offline (t1jax/sandbox/images.py maps them): bookworm (Python
# 3.11) for debian and the default, trixie (Python 3.13) for python:3.13 images, noble (Ubuntu
# 24.04, Python 3.12, from archive.ubuntu.com) for ubuntu:24.04 and python:3.12. All have a
# `python` command, pip (usable system-wide, as in the python images) and pytest. bubblewrap
# uses the bookworm root filesystem. noble is optional: where Ubuntu's archive cannot be
# reached, bookworm stands in for ubuntu:24.04 (images.py warns when it does).
ROOTFS=${T1JAX_ROOTFS:-$HOME/.cache/t1jax/rootfs-bookworm}
rootfs_ok() {  # DIR PACKAGES
  [ -x "$1/usr/bin/python3" ] && [ "$(cat "$1.stamp" 2>/dev/null)" = "$(stamp_of "$2")" ]
}
stamp_of() { printf %s "$1:pip-unmanaged" | sha256sum | cut -c1-12; }
image_ok() {  # IMAGE PACKAGES
  [ "$(docker image inspect -f '{{index .Config.Labels "t1jax.base.packages"}}' "$1" 2>/dev/null)" = "$(stamp_of "$2")-tmp" ]
}
build_rootfs() {  # SUITE DIR PACKAGES  (DEBOOTSTRAP_ARGS: extra options, MIRROR: the archive)
  command -v debootstrap >/dev/null || apt_install debootstrap || die "debootstrap missing; apt-get install debootstrap"
  log "building the $1 sandbox root filesystem with debootstrap (about a minute)"
  # a debootstrap killed mid-way leaves /proc and /sys mounted in its target: unmount them, and
  # never let rm cross into a mount (it would reach the host's own files)
  if [ -d "$2.tmp" ]; then
    findmnt -rn -o TARGET | grep -F "$2.tmp/" | sort -r | while read -r m; do as_root umount -l "$m" || true; done
    as_root rm -rf --one-file-system "$2.tmp" || die "could not remove the unfinished $2.tmp; remove it by hand"
  fi
  mkdir -p "$(dirname "$2")"
  # shellcheck disable=SC2086  # DEBOOTSTRAP_ARGS is a list of options
  as_root debootstrap --variant=minbase ${DEBOOTSTRAP_ARGS:-} --include="$3" "$1" "$2.tmp" \
    "${MIRROR:-http://deb.debian.org/debian}" ${DEBOOTSTRAP_SCRIPT:-} \
    >"/tmp/t1jax-debootstrap-$1.log" 2>&1 || die "debootstrap $1 failed; see /tmp/t1jax-debootstrap-$1.log"
  as_root rm -rf "$2.tmp"/var/cache/apt/archives/*.deb
  # `pip install` into the system Python works, as in the official python images (no PEP 668)
  as_root rm -f "$2.tmp"/usr/lib/python3*/EXTERNALLY-MANAGED
  as_root rm -rf "$2"
  mv "$2.tmp" "$2"
  stamp_of "$3" > "$2.stamp"
}
base_image() {  # SUITE IMAGE DIR PACKAGES
  image_ok "$2" "$4" && return 0
  rootfs_ok "$3" "$4" || build_rootfs "$1" "$3" "$4"
  log "importing $3 as $2"
  # the file in /tmp keeps it on disk under gVisor (a tmpfs over an empty /tmp would hide files
  # the verifier's snapshot needs)
  as_root sh -c "echo 'keeps /tmp on disk under gVisor' > '$3/tmp/.t1jax-keep'"
  tar -C "$3" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    -c 'CMD ["/bin/bash"]' -c "LABEL t1jax.base.packages=$(stamp_of "$4")-tmp" - "$2" >/dev/null \
    || die "docker import of the base image $2 failed"
  # only bubblewrap reads a root filesystem, bookworm's: the others live on in the image alone
  if [ "$3" != "$ROOTFS" ]; then
    as_root rm -rf --one-file-system "$3" && rm -f "$3.stamp"
  fi
}
if [ "${T1JAX_SKIP_DOCKER:-0}" = 1 ]; then
  rootfs_ok "$ROOTFS" "$BASE_PACKAGES" || build_rootfs bookworm "$ROOTFS" "$BASE_PACKAGES"
else
  base_image bookworm "$BASE_IMAGE" "$ROOTFS" "$BASE_PACKAGES"
  base_image trixie "$TRIXIE_IMAGE" "$HOME/.cache/t1jax/rootfs-trixie" "$TRIXIE_PACKAGES"
  # Ubuntu's archive signs with Ubuntu's keys (Debian ships them as ubuntu-keyring, in
  # bookworm-backports on Debian 12); a debootstrap without a noble script runs gutsy's, which
  # every Ubuntu release since uses; pytest and pip are in universe
  UBUNTU_KEYRING=/usr/share/keyrings/ubuntu-archive-keyring.gpg
  noble_image() {
    [ -f "$UBUNTU_KEYRING" ] || apt_install -t bookworm-backports ubuntu-keyring \
      || apt_install ubuntu-keyring || die "could not install ubuntu-keyring"
    script=""; [ -e /usr/share/debootstrap/scripts/noble ] || script=/usr/share/debootstrap/scripts/gutsy
    DEBOOTSTRAP_ARGS="--keyring=$UBUNTU_KEYRING --components=main,universe" \
      MIRROR=http://archive.ubuntu.com/ubuntu DEBOOTSTRAP_SCRIPT=$script \
      base_image noble "$NOBLE_IMAGE" "$HOME/.cache/t1jax/rootfs-noble" "$NOBLE_PACKAGES"
  }
  if ! (noble_image); then
    if [ "${T1JAX_REQUIRE_NOBLE:-0}" = 1 ]; then
      die "could not build $NOBLE_IMAGE (see above); T1JAX_REQUIRE_NOBLE=1 asks for it"
    fi
    log "WARNING: could not build $NOBLE_IMAGE (Ubuntu 24.04) from archive.ubuntu.com; tasks on ubuntu:24.04 will build on $BASE_IMAGE (Debian 12, Python 3.11) with a warning"
  fi
fi

# --- 4. Headless Chromium (tests/report/test_report.py) ----------------------------------------
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  log "installing Debian's chromium (headless browser for the trajectory-viewer test)"
  if ! apt_install chromium; then
    if [ "${T1JAX_REQUIRE_DOCKER:-0}" = 1 ]; then
      die "could not install chromium (needs root and apt); CI runs the viewer test in it. apt-get install chromium and re-run."
    fi
    log "WARNING: could not install chromium (needs root and apt): the browser checks in tests/report/test_report.py will skip. Install it with: sudo apt-get install chromium"
  fi
fi
if [ "${T1JAX_SKIP_DOCKER:-0}" != 1 ]; then
  log "sandbox runtimes: $(docker info -f '{{range $k, $v := .Runtimes}}{{$k}} {{end}}'); storage driver: $(docker info -f '{{.Driver}}')"
fi
log "ready"
