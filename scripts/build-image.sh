#!/usr/bin/env bash
# Build the workload image (docker/Dockerfile) with podman on a machine that reaches no image registry:
# the base is made from Debian's packages (debootstrap), torch comes from the local CPU wheel and the
# rest from the local package mirror when the machine has them (else from the indexes pip reaches).
# The image is tagged by the hash of everything that goes into it, so an unchanged tree is not rebuilt.
#   scripts/build-image.sh            -> prints the image reference (localhost/temper-workload:<hash>)
#   scripts/build-image.sh --tag      -> prints the reference this tree's image has, without building
#   scripts/build-image.sh --worker [--tag]  -> the same for the Prefect worker's image (docker/Dockerfile.worker,
#                                       localhost/temper-prefect-worker:<hash>): prefect + prefect-kubernetes
# Needs root (podman, debootstrap): `make image` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=localhost/debian-min:bookworm
NAME=localhost/temper-workload
DOCKERFILE=docker/Dockerfile
if [ "${1:-}" = "--worker" ]; then
  shift
  NAME=localhost/temper-prefect-worker
  DOCKERFILE=docker/Dockerfile.worker
fi
# Here podman must not set rlimits it is not allowed to (containers.conf) and crun refuses the cgroup
# layout, so runc (measured, ../shared/STACK_NOTES.md).
export CONTAINERS_CONF="${CONTAINERS_CONF:-$PWD/docker/containers.conf}"
PODMAN=(podman --runtime runc)

if ! "${PODMAN[@]}" image exists "$BASE"; then
  if [ "${1:-}" = "--tag" ]; then echo "no base image $BASE: run scripts/build-image.sh" >&2; exit 1; fi
  root=$(mktemp -d /var/tmp/debian-min.XXXX)
  echo "building the base $BASE with debootstrap (minbase bookworm)" >&2
  debootstrap --variant=minbase bookworm "$root" >&2
  tar -C "$root" -c . | "${PODMAN[@]}" import \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" - "$BASE" >&2
  rm -rf "$root"
fi

# Inputs: the Dockerfile, what it copies, the base image's id and the package sources.
if [ "$DOCKERFILE" = docker/Dockerfile.worker ]; then  # it copies pyproject.toml only (the pins)
  inputs=$( { "${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE"; cat docker/Dockerfile.worker pyproject.toml; \
              ls /opt/wheels 2>/dev/null || true; } | sha256sum | cut -c1-12)
else
inputs=$( { "${PODMAN[@]}" image inspect --format '{{.Id}}' "$BASE"; \
            git ls-files -s docker/Dockerfile pyproject.toml README.md temper infra workloads data_contracts flows \
              tasks configs domains docker/accelerate-zero3-multinode.yaml docker/accelerate-zero3-multinode-cpu.yaml; \
            git diff HEAD -- temper infra workloads data_contracts flows tasks configs domains docker pyproject.toml; \
            ls /opt/wheels 2>/dev/null || true; } | sha256sum | cut -c1-12)
fi
IMAGE="$NAME:$inputs"
if [ "${1:-}" = "--tag" ]; then echo "$IMAGE"; exit 0; fi
if "${PODMAN[@]}" image exists "$IMAGE"; then
  echo "$IMAGE is built (inputs unchanged)" >&2
  echo "$IMAGE"
  exit 0
fi

args=(--build-arg "BASE_IMAGE=$BASE" --network host -v /etc/ssl/certs/ca-certificates.crt:/host-ca.crt:ro
      --build-arg PIP_CERT=/host-ca.crt)
# The local torch wheel and package mirror, mounted at the same paths, when this machine has them.
extra=()
for dir in /opt/pypi /opt/pypi-more; do
  if [ -d "$dir/simple" ]; then args+=(-v "$dir:$dir:ro"); extra+=("file://$dir/simple"); fi
done
[ ${#extra[@]} -gt 0 ] && args+=(--build-arg "PIP_EXTRA_INDEX_URL=${extra[*]}")
if [ -d /opt/wheels ]; then args+=(-v /opt/wheels:/opt/wheels:ro --build-arg PIP_FIND_LINKS=/opt/wheels); fi

# The code version runs in the image record as their git commit (the image has no .git): the commit, and
# -dirty-<sha256 of the local edits> as infra/tracking/runs.py:code_fingerprint writes it outside an image.
if [ "$DOCKERFILE" = docker/Dockerfile ]; then
  code=$(git rev-parse HEAD)
  if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
    code="$code-dirty-$(git diff HEAD --binary | sha256sum | cut -c1-16)"
  fi
  args+=(--build-arg "TEMPER_CODE_VERSION=$code")
fi

echo "building $IMAGE" >&2
"${PODMAN[@]}" build -f "$DOCKERFILE" "${args[@]}" -t "$IMAGE" -t "$NAME:latest" . >&2
echo "$IMAGE"
