#!/usr/bin/env bash
# Build the acker image, the Spark image (standalone master, workers and driver of a
# tracked pipeline) and, for the compose suite, a Prometheus image with no container
# registry: a Debian base made by debootstrap and `docker import`, the project's wheels
# and its dependencies' built on the host and copied in.
#
#   deploy/images/build.sh [all|base|acker|spark|prometheus|brokers]     (make images runs "all")
#
# Environment (defaults in brackets):
#   ACKER_BASE_IMAGE        base image to build on [pyspark-acker-base:$DEBIAN_SUITE];
#                           made with debootstrap only when it is not present locally
#   ACKER_IMAGE             the acker image [pyspark-acker:latest]
#   ACKER_BUILD_STAGE_IMAGE its install stage, kept as build cache [pyspark-acker-build:latest]
#   ACKER_SPARK_IMAGE       the Spark image [pyspark-acker-spark:latest]; Java from the base's
#                           Debian mirror, pyspark, pyarrow and pandas at the versions PYTHON has
#   ACKER_PROMETHEUS_IMAGE  the local Prometheus image [pyspark-acker-prometheus:latest];
#                           built only when not present locally
#   ACKER_BROKERS_IMAGE     Redis and RabbitMQ from Debian's packages, for the compose file's
#                           queue services [pyspark-acker-brokers:latest]; built only when not present
#   DEBIAN_SUITE            Debian release of the base [bookworm: its python3 is 3.11]
#   DEBIAN_MIRROR           mirror for debootstrap [read from /etc/apt/sources.list*]
#   PYTHON                  Python that builds the wheels [.venv/bin/python, else python3];
#                           must be the same minor version as the base image's python3
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$REPO/deploy/images"
SUITE=${DEBIAN_SUITE:-bookworm}
BASE_IMAGE=${ACKER_BASE_IMAGE:-pyspark-acker-base:$SUITE}
ACKER_IMAGE=${ACKER_IMAGE:-pyspark-acker:latest}
ACKER_BUILD_STAGE_IMAGE=${ACKER_BUILD_STAGE_IMAGE:-pyspark-acker-build:latest}
PROMETHEUS_IMAGE=${ACKER_PROMETHEUS_IMAGE:-pyspark-acker-prometheus:latest}
SPARK_IMAGE=${ACKER_SPARK_IMAGE:-pyspark-acker-spark:latest}
BROKERS_IMAGE=${ACKER_BROKERS_IMAGE:-pyspark-acker-brokers:latest}
WHEELS="$REPO/build/docker/wheels"
# Kept between builds: pyspark alone is a 400 MB wheel, fetched and installed again only
# when a pin changes.
SPARK_WHEELS="$REPO/build/docker/spark-wheels"
SPARK_CONTEXT="$REPO/build/docker/spark-context"
# What this checkout's builds of these tags carry as their label value: the prune after
# a build removes only their own superseded images, never another checkout's or user's.
BUILD_ID=$(printf '%s|%s|%s' "$REPO" "$ACKER_IMAGE" "$ACKER_BUILD_STAGE_IMAGE" | sha256sum | cut -c1-16)
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi

log() { echo "build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }
python_minor() { "$@" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

SCRATCH=$(mktemp -d)
cleanup() { $SUDO rm -rf "$SCRATCH"; }
trap cleanup EXIT

build_base() {
  if image_exists "$BASE_IMAGE"; then
    log "base image $BASE_IMAGE is present: not rebuilding it"
    return
  fi
  command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] \
    || die "debootstrap is missing (apt-get install debootstrap; make system-deps does it)"
  local mirror=${DEBIAN_MIRROR:-$(python3 "$HERE/debian_mirror.py" --suite "$SUITE")}
  local rootfs="$SCRATCH/rootfs" started=$SECONDS
  log "debootstrap $SUITE from $mirror (minbase + python3-venv)"
  # minbase: dpkg, apt and the essential tools (useradd comes with passwd);
  # python3-venv brings python3 and the pip wheel that `python3 -m venv` installs.
  $SUDO debootstrap --variant=minbase --include=python3-venv "$SUITE" "$rootfs" "$mirror" >"$SCRATCH/debootstrap.log" 2>&1 \
    || { tail -n 30 "$SCRATCH/debootstrap.log" >&2; die "debootstrap failed (full log above)"; }
  local base_python
  base_python=$($SUDO chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  log "base python3 is $base_python"
  # What a container never needs: package caches and lists, documentation, locales.
  $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
    "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/tmp/*
  $SUDO tar --numeric-owner -C "$rootfs" -c . \
    | docker import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
      --message "debootstrap --variant=minbase $SUITE" - "$BASE_IMAGE" >/dev/null
  log "base image $BASE_IMAGE built in $((SECONDS - started)) s"
}

check_python_match() {
  local host base
  host=$(python_minor "$PYTHON")
  base=$(docker run --rm --entrypoint python3 "$BASE_IMAGE" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$host" = "$base" ] || die "the wheels would be built for Python $host ($PYTHON) but $BASE_IMAGE has python3 $base; set PYTHON to a $base interpreter"
}

build_wheels() {
  local started=$SECONDS
  rm -rf "$WHEELS"
  mkdir -p "$WHEELS"
  # pip builds the project in place, and setuptools copies build/lib into the wheel as it
  # finds it: a module deleted from the tree since the last build would ship again.
  rm -rf "$REPO"/build/lib.* "$REPO"/build/bdist.*
  log "building the project's wheel and its dependencies' into ${WHEELS#"$REPO"/}"
  # Whatever the project's build backend makes (pure Python or with a native
  # extension), plus every dependency of the server (the [server] extra), for
  # this host's Python.
  # Fixed zip timestamps make an unchanged project give a byte-identical wheel, so
  # the image build stays a Docker cache hit (hatchling does this by itself,
  # setuptools' bdist_wheel only with SOURCE_DATE_EPOCH).
  SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 315532800)} \
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check "$REPO[server]" -w "$WHEELS"
  log "wheels built in $((SECONDS - started)) s ($(ls "$WHEELS" | wc -l) files)"
}

build_acker() {
  check_python_match
  build_wheels
  local started=$SECONDS
  log "building $ACKER_IMAGE on $BASE_IMAGE"
  local build=(docker build --quiet -f "$REPO/deploy/Dockerfile" --build-arg "BASE_IMAGE=$BASE_IMAGE"
    --build-arg "ACKER_BUILD_ID=$BUILD_ID")
  # The install stage gets a name too: tagged, it stays the build cache, and every
  # untagged image with this build's label value is a superseded build of ours that can go.
  "${build[@]}" --target install -t "$ACKER_BUILD_STAGE_IMAGE" "$REPO" >/dev/null
  "${build[@]}" -t "$ACKER_IMAGE" "$REPO" >/dev/null
  docker image prune --force --filter "label=io.pyspark-acker.build=$BUILD_ID" >/dev/null
  log "$ACKER_IMAGE built in $((SECONDS - started)) s, $(docker image inspect -f '{{.Size}}' "$ACKER_IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
}

# The Spark side's pins: the versions this Python (the driver's, in a local venv) has, so a
# driver outside the image runs the pyspark its executors run.
spark_pins() {
  "$PYTHON" - <<'PY'
from importlib.metadata import PackageNotFoundError, version
for name in ("pyspark", "pyarrow", "pandas", "numpy"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        raise SystemExit(f"{name} is not installed in this Python: install the [spark] extra (make venv)")
PY
}

# Install wheels into a folder of the Spark image's context the way pip installs them in a
# venv, byte-compiled (every executor's Python workers import pyspark, pandas and pyarrow);
# scripts are dropped (their #! names this host's Python).
install_into() {
  local target=$1
  shift
  rm -rf "$target"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --target "$target" "$@"
  rm -rf "$target/bin"
  # Hash-checked byte code: the same files on every build (mtime-stamped byte code would not
  # be), so Docker's cache keeps an unchanged project's layer.
  "$PYTHON" -m compileall -q -j 0 --invalidation-mode checked-hash "$target" >/dev/null
}

build_spark() {
  local started=$SECONDS pins
  pins=$(spark_pins)
  if [ "$(cat "$SPARK_WHEELS/pins.txt" 2>/dev/null)" != "$pins" ]; then
    log "fetching the Spark wheels ($(echo $pins)) into ${SPARK_WHEELS#"$REPO"/}"
    rm -rf "$SPARK_WHEELS"
    mkdir -p "$SPARK_WHEELS"
    # shellcheck disable=SC2086 # one pin per word
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check -w "$SPARK_WHEELS" $pins
    echo "$pins" >"$SPARK_WHEELS/pins.txt"
  fi
  # The dependencies: the pinned wheels, then the acker build's for the rest (grpcio,
  # protobuf, ...), one wheel per distribution. Installed again only when that list changes.
  local deps=("$SPARK_WHEELS"/*.whl) wheel name project=()
  for wheel in "$WHEELS"/*.whl; do
    name=$(basename "$wheel")
    case "$name" in
      pyspark_acker-*) project+=("$wheel") ;;
      *) [ -n "$(ls "$SPARK_WHEELS/${name%%-*}"-*.whl 2>/dev/null)" ] || deps+=("$wheel") ;;
    esac
  done
  local listing
  listing=$(printf '%s\n' "${deps[@]##*/}")
  if [ "$(cat "$SPARK_CONTEXT/deps.txt" 2>/dev/null)" != "$listing" ]; then
    log "installing the Spark image's dependencies into ${SPARK_CONTEXT#"$REPO"/}/deps"
    install_into "$SPARK_CONTEXT/deps" "${deps[@]}"
    echo "$listing" >"$SPARK_CONTEXT/deps.txt"
  fi
  install_into "$SPARK_CONTEXT/project" "${project[@]}"
  cp "$HERE/spark/spark-entrypoint" "$SPARK_CONTEXT/"
  log "building $SPARK_IMAGE on $BASE_IMAGE"
  docker build --quiet -f "$HERE/spark/Dockerfile" --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    --build-arg "ACKER_BUILD_ID=$BUILD_ID" -t "$SPARK_IMAGE" "$SPARK_CONTEXT" >/dev/null
  docker image prune --force --filter "label=io.pyspark-acker.build=$BUILD_ID" >/dev/null
  # What an executor imports, with the interpreter it runs.
  docker run --rm --entrypoint /opt/acker/bin/python "$SPARK_IMAGE" \
    -c 'import pyspark, pyarrow, pandas, acker_spark, acker_demo.dataframe_job' \
    || die "$SPARK_IMAGE cannot import what an executor needs"
  log "$SPARK_IMAGE built in $((SECONDS - started)) s, $(docker image inspect -f '{{.Size}}' "$SPARK_IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"
}

build_prometheus() {
  if image_exists "$PROMETHEUS_IMAGE"; then
    log "Prometheus image $PROMETHEUS_IMAGE is present: not rebuilding it"
    return
  fi
  local context="$SCRATCH/prometheus" started=$SECONDS
  mkdir -p "$context/rootfs/usr/bin" "$context/rootfs/usr/share"
  # Debian's package, fetched with the host's apt configuration and unpacked on
  # the host: only the server, promtool and the web assets go into the image.
  if ! (cd "$SCRATCH" && apt-get download prometheus >/dev/null 2>&1); then
    log "apt-get download prometheus failed; updating the package lists and retrying"
    $SUDO apt-get update -qq
    (cd "$SCRATCH" && apt-get download prometheus >/dev/null)
  fi
  dpkg-deb -x "$SCRATCH"/prometheus_*.deb "$SCRATCH/prometheus-deb"
  cp "$SCRATCH/prometheus-deb/usr/bin/prometheus" "$SCRATCH/prometheus-deb/usr/bin/promtool" "$context/rootfs/usr/bin/"
  cp -r "$SCRATCH/prometheus-deb/usr/share/prometheus" "$context/rootfs/usr/share/"
  cp "$HERE/prometheus/Dockerfile" "$context/"
  docker build --quiet --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$PROMETHEUS_IMAGE" "$context" >/dev/null
  log "$PROMETHEUS_IMAGE built in $((SECONDS - started)) s"
}

build_brokers() {
  if image_exists "$BROKERS_IMAGE"; then
    log "brokers image $BROKERS_IMAGE is present: not rebuilding it"
    return
  fi
  local started=$SECONDS
  docker build --quiet --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$BROKERS_IMAGE" "$HERE/brokers" >/dev/null
  log "$BROKERS_IMAGE built in $((SECONDS - started)) s"
}

docker info >/dev/null 2>&1 || die "no Docker engine answers (docker info failed)"
case "${1:-all}" in
  all) build_base; build_acker; build_spark; build_prometheus; build_brokers ;;
  base) build_base ;;
  acker) build_base; build_acker ;;
  spark) build_base; check_python_match; build_wheels; build_spark ;;
  prometheus) build_base; build_prometheus ;;
  brokers) build_base; build_brokers ;;
  *) die "unknown target '$1' (all, base, acker, spark, prometheus or brokers)" ;;
esac
