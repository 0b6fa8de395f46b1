#!/usr/bin/env bash
# `make test-containers`: the tests whose pods are real containers (tests/integration/containers), which
# `make test` leaves out, and the Prefect worker's image test. Installs podman/runc/catatonit/debootstrap if
# missing, builds this tree's workload and worker images (scripts/build-image.sh: cached by the hash of its inputs, cold ~12 min, warm seconds), then runs the
# tests with TEMPER_REQUIRE_CONTAINERS=1, so a missing image or podman fails them instead of skipping them.
# Rootful podman (the pods' bridge network): needs root, or sudo, as scripts/system-deps.sh does. Where podman
# cannot run containers at all, it says so in one line and exits non-zero: it never passes having run nothing.
#   scripts/test-containers.sh PYTHON [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:?usage: scripts/test-containers.sh PYTHON [pytest args...]}
shift
fail() { echo "make test-containers: $*" >&2; exit 1; }

if [ "$(id -u)" != 0 ]; then
  sudo -n true 2>/dev/null || fail "podman needs root here (rootful, for the pods' bridge network): not root and no sudo"
  exec sudo -n -E env "PATH=$PATH" bash "$0" "$PY" "$@"
fi

# Debian's podman 4.3 as measured here (../shared/STACK_NOTES.md; with its recommends): runc (crun refuses a hybrid
# cgroup layout), netavark (the bridge network; its firewall driver runs the iptables binary, which a fresh
# Debian VM may lack: then every pod fails with "netavark: No such file or directory"), catatonit (podman builds
# the pods' pause image from it).
need=()
for tool in podman runc debootstrap catatonit; do command -v "$tool" >/dev/null || need+=("$tool"); done
[ -x /usr/lib/podman/netavark ] || need+=(netavark)
command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  apt-get update -qq || fail "apt-get update failed: cannot install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc netavark iptables catatonit debootstrap >&2 \
    || fail "could not install ${need[*]} with apt-get"
fi

export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/docker/containers.conf}"
start=$(date +%s)
if ! image=$(bash scripts/build-image.sh); then
  base=localhost/debian-min:bookworm
  if err=$(podman --runtime runc run --rm --network none "$base" true 2>&1); then
    fail "building the workload image failed (podman runs containers here): see the build's output above"
  fi
  fail "podman cannot run containers here: $(echo "$err" | tail -1)"
fi
echo "workload image $image ready in $(( $(date +%s) - start ))s" >&2
start=$(date +%s)
worker=$(bash scripts/build-image.sh --worker) || fail "building the Prefect worker's image failed: see the build's output above"
echo "worker image $worker ready in $(( $(date +%s) - start ))s" >&2
TEMPER_REQUIRE_CONTAINERS=1 "$PY" -m pytest -q --durations=10 tests/integration/containers \
  tests/integration/test_worker_image.py "$@"
