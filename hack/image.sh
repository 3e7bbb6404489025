#!/usr/bin/env bash
# Build the Chronotope image (Dockerfile) on a machine with no container registry.
#
#   hack/image.sh [build]   build ${CHRONOTOPE_IMAGE:-chronotope:dev}
#   hack/image.sh stop      stop the Docker daemon a build started (if it did)
#
# build:
#   1. installs Debian's docker.io and debootstrap with apt if missing;
#   2. starts dockerd if no daemon answers, and records its pid in
#      ${CHRONOTOPE_STATE_DIR:-~/.local/state/chronotope}/docker/dockerd.pid, so
#      `hack/image.sh stop` stops that daemon and no other;
#   3. makes the base image chronotope-base:bookworm (Debian bookworm, debootstrap
#      --variant=minbase, python3 3.11 + python3-venv + ca-certificates) from a rootfs
#      tarball cached under ${CHRONOTOPE_CACHE_DIR:-~/.cache/chronotope}/image/;
#   4. docker build --network host (pip reaches PyPI from the host network).
# No image is pulled. Needs root or passwordless sudo, and the Debian mirror
# (${DEBIAN_MIRROR:-http://deb.debian.org/debian}) and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${CHRONOTOPE_IMAGE:-chronotope:dev}
BASE=${CHRONOTOPE_BASE_IMAGE:-chronotope-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
CACHE=${CHRONOTOPE_CACHE_DIR:-$HOME/.cache/chronotope}/image
STATE=${CHRONOTOPE_STATE_DIR:-$HOME/.local/state/chronotope}/docker
PIDFILE=$STATE/dockerd.pid
# The base's cache key: a change to the suite or the package list makes a new tarball.
BASE_KEY=$SUITE-minbase-$(printf '%s' "$BASE_PACKAGES" | sha256sum | cut -c1-12)

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo -n"
fi

log() { printf '[image.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The docker client, through sudo when the daemon's socket is not ours to use.
dk() {
  if [[ -z "$sudo" ]] || [[ -w /var/run/docker.sock ]]; then
    docker "$@"
  else
    $sudo --preserve-env=DOCKER_BUILDKIT docker "$@"
  fi
}

daemon_answers() { dk info >/dev/null 2>&1; }

ensure_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  command -v docker >/dev/null 2>&1 || missing+=(docker.io)
  command -v debootstrap >/dev/null 2>&1 || [[ -x /usr/sbin/debootstrap ]] || missing+=(debootstrap)
  [[ ${#missing[@]} -eq 0 ]] && return 0
  # shellcheck disable=SC2207  # de-duplicate the package names
  missing=($(printf '%s\n' "${missing[@]}" | sort -u))
  log "installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    $sudo apt-get update >/dev/null
    $sudo apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
  }
  command -v dockerd >/dev/null 2>&1 || die "docker.io installed but dockerd is not on PATH"
}

start_daemon() {
  daemon_answers && return 0
  command -v dockerd >/dev/null 2>&1 || die "no Docker daemon answers and dockerd is not installed"
  mkdir -p "$STATE"
  local logfile=$STATE/dockerd.log
  log "no Docker daemon answers: starting dockerd (log: $logfile)"
  # its own session, so it outlives this script and the caller's process group;
  # dockerd writes the pid file itself and removes it when it exits
  $sudo setsid dockerd --pidfile "$PIDFILE" </dev/null >"$logfile" 2>&1 &
  local _
  for _ in $(seq 1 120); do
    daemon_answers && break
    sleep 0.5
  done
  if ! daemon_answers; then
    tail -n 20 "$logfile" >&2 || true
    die "dockerd did not answer within 60 s (log above: $logfile)"
  fi
  log "started dockerd (pid $(cat "$PIDFILE")); stop it with: hack/image.sh stop"
}

stop_daemon() {
  if [[ ! -f "$PIDFILE" ]]; then
    log "no dockerd started by hack/image.sh is running ($PIDFILE absent)"
    return 0
  fi
  local pid
  pid=$(cat "$PIDFILE")
  if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" != dockerd ]]; then
    log "pid $pid in $PIDFILE is not a running dockerd: removing the stale pid file"
    $sudo rm -f "$PIDFILE"
    return 0
  fi
  log "stopping dockerd (pid $pid)"
  $sudo kill -TERM "$pid"
  local _
  for _ in $(seq 1 60); do
    [[ -d /proc/$pid ]] || break
    sleep 0.5
  done
  [[ -d /proc/$pid ]] && die "dockerd (pid $pid) still runs 30 s after SIGTERM"
  $sudo rm -f "$PIDFILE"
  log "dockerd stopped"
}

base_tarball() {
  local tarball=$CACHE/$BASE_KEY.tar
  if [[ -f "$tarball" ]]; then
    printf '%s\n' "$tarball"
    return 0
  fi
  mkdir -p "$CACHE"
  local rootfs
  rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap must remove this rootfs
  trap "$sudo rm -rf '$rootfs' '$tarball.part'" EXIT
  log "debootstrap $SUITE minbase + $BASE_PACKAGES from $MIRROR (first run only)"
  $sudo debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
    >"$CACHE/debootstrap.log" 2>&1 || {
    tail -n 20 "$CACHE/debootstrap.log" >&2
    die "debootstrap failed (log above: $CACHE/debootstrap.log)"
  }
  # what an image never needs: downloaded .debs, apt lists, docs, manuals, locales
  $sudo rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc "$rootfs"/usr/share/man "$rootfs"/usr/share/info \
    "$rootfs"/usr/share/locale "$rootfs"/var/log/*.log
  $sudo tar --numeric-owner -C "$rootfs" -cf "$tarball.part" .
  $sudo chown "$(id -u):$(id -g)" "$tarball.part"
  mv "$tarball.part" "$tarball"
  $sudo rm -rf "$rootfs"
  trap - EXIT
  printf '%s\n' "$tarball"
}

ensure_base() {
  local have
  have=$(dk image inspect --format '{{ index .Config.Labels "chronotope.base" }}' "$BASE" 2>/dev/null || true)
  if [[ "$have" == "$BASE_KEY" ]]; then
    log "base image $BASE is up to date ($BASE_KEY)"
    return 0
  fi
  local tarball
  tarball=$(base_tarball)
  log "importing $tarball as $BASE"
  dk import \
    --change "LABEL chronotope.base=$BASE_KEY" \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    "$tarball" "$BASE" >/dev/null
}

# Locally added CAs (Debian's /usr/local/share/ca-certificates, or the PEM file
# CHRONOTOPE_EXTRA_CA_FILE): pip in the build trusts them too, for a TLS-intercepting
# proxy between this machine and PyPI.
extra_ca_certs() {
  if [[ -n "${CHRONOTOPE_EXTRA_CA_FILE:-}" ]]; then
    cat "$CHRONOTOPE_EXTRA_CA_FILE"
  elif [[ -d /usr/local/share/ca-certificates ]]; then
    find /usr/local/share/ca-certificates -name '*.crt' -type f -print0 | sort -z | xargs -0r cat
  fi
}

build() {
  ensure_packages
  start_daemon
  ensure_base
  log "docker build -t $IMAGE (BASE_IMAGE=$BASE)"
  # the classic builder: BuildKit would need the buildx plugin, which Debian's docker.io
  # lacks; the Dockerfile works with either
  DOCKER_BUILDKIT=0 dk build --network host --build-arg "BASE_IMAGE=$BASE" \
    --build-arg "EXTRA_CA_CERTS=$(extra_ca_certs)" -t "$IMAGE" . \
    >"$STATE/build.log" 2>&1 || {
    tail -n 30 "$STATE/build.log" >&2
    die "docker build failed (log above: $STATE/build.log)"
  }
  log "built $IMAGE ($(dk image inspect --format '{{ .Size }}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}'))"
}

case "${1:-build}" in
  build) mkdir -p "$STATE" && build ;;
  stop) stop_daemon ;;
  -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) die "unknown command ${1@Q} (build | stop)" ;;
esac
