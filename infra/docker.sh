#!/usr/bin/env bash
# Makes sure a Docker Engine answers on DOCKER_HOST or /var/run/docker.sock: installs docker.io
# when missing (root only) and starts dockerd in the background (recording its pid in
# /run/kiln-dockerd.pid). Then sets up gVisor: installs Debian's runsc when missing (root only),
# picks the gVisor platform that works on this machine, registers the runtimes kiln-gvisor and
# kiln-gvisor-nonet in /etc/docker/daemon.json (merged with what is there) and, only when that
# changed the file and the dockerd running is the one this script started, reloads it. Without
# gVisor, Kiln runs its sandboxes with runc only (and says so here). Last, it makes sure dockerd's
# experimental API (checkpoints: idle gVisor sandboxes are paused to disk) is on.
#
# KILN_GVISOR_PLATFORM=<name> skips the probe and uses that platform (it must still work).
# KILN_GVISOR_SLICE_US=<µs> (300 by default; 0: none) registers runsc through a wrapper that gives
# every process of a gVisor sandbox that CPU time slice (infra/daemon-json.ts says why).
# KILN_DOCKER_DAEMON_JSON and KILN_DOCKERD_PIDFILE point the script at other files (for testing it).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DAEMON_JSON="${KILN_DOCKER_DAEMON_JSON:-/etc/docker/daemon.json}"
PIDFILE="${KILN_DOCKERD_PIDFILE:-/run/kiln-dockerd.pid}"
# Fastest first; the first that runs a process within the timeout wins (KVM hangs on some VMs).
PLATFORMS=(systrap kvm ptrace)
PROBE_TIMEOUT_S=10

docker_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_dockerd() {
  say "starting dockerd (log: /var/log/kiln-dockerd.log)"
  setsid nohup dockerd >>/var/log/kiln-dockerd.log 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 120); do
    if [ -S /var/run/docker.sock ] && docker_up; then
      say "dockerd is up"
      return 0
    fi
    sleep 0.5
  done
  tail -n 20 /var/log/kiln-dockerd.log >&2 || true
  die "dockerd did not come up within 60 s (see /var/log/kiln-dockerd.log)"
}

ensure_dockerd() {
  if command -v docker >/dev/null 2>&1 && docker_up; then
    return 0
  fi
  if [ -n "${DOCKER_HOST:-}" ]; then
    die "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST"
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    is_root || die "Docker Engine is not installed and this is not root: install docker.io (apt-get install docker.io) or point DOCKER_HOST at an engine"
    apt_install docker.io
  fi
  is_root || die "Docker Engine is installed but not running, and only root can start it here: start dockerd or point DOCKER_HOST at an engine"
  start_dockerd
}

# The dockerd running now is the one this script started (its pid file names a live dockerd).
# Stops the dockerd this script started ($1) and starts it again; $2 says why, in the message.
restart_dockerd() {
  say "restarting dockerd ($1)$2"
  kill -TERM "$1"
  for _ in $(seq 1 60); do [ -d "/proc/$1" ] || break; sleep 0.5; done
  [ -d "/proc/$1" ] && die "dockerd ($1) did not stop within 30 s"
  start_dockerd
}

started_by_us() {
  local pid
  pid="$(cat "$PIDFILE" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]
}

gvisor_registered() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"kiln-gvisor-nonet"'; }

daemon_json() { "$KILN_ROOT/node_modules/.bin/tsx" "$KILN_ROOT/infra/daemon-json.ts" "$@"; }

offers() { "$1" flags 2>&1 | grep -A1 -e '-platform string' | grep -qw "$2"; }

# Runs /bin/true in a throw-away gVisor sandbox on this platform, killed if it hangs.
probe() {
  timeout -k 2 "$PROBE_TIMEOUT_S" "$1" --platform="$2" --network=none do /bin/true >/dev/null 2>&1
}

runc_only() { say "gVisor: $*; Kiln runs its sandboxes with runc only"; }

setup_gvisor() {
  if [ -n "${DOCKER_HOST:-}" ]; then
    if gvisor_registered; then say "gVisor: the engine at DOCKER_HOST has the kiln-gvisor runtimes"
    else runc_only "the engine at DOCKER_HOST has no kiln-gvisor-nonet runtime (register it there, see docs/security.md)"; fi
    return 0
  fi
  local runsc
  runsc="$(command -v runsc || true)"
  if [ -z "$runsc" ]; then
    is_root || { runc_only "runsc is not installed and this is not root (apt-get install runsc)"; return 0; }
    if ! (apt_install runsc); then runc_only "Debian's runsc package could not be installed"; return 0; fi
    runsc="$(command -v runsc || true)"
    [ -n "$runsc" ] || { runc_only "the runsc package installed no runsc"; return 0; }
  fi
  if ! is_root; then
    if gvisor_registered; then say "gVisor: dockerd has the kiln-gvisor runtimes"
    else runc_only "only root can register runsc with dockerd"; fi
    return 0
  fi
  [ -x "$KILN_ROOT/node_modules/.bin/tsx" ] || die "node_modules is missing: run npm ci first"

  local recorded platform=""
  recorded="$(daemon_json "$DAEMON_JSON" --platform)"
  if [ -n "${KILN_GVISOR_PLATFORM:-}" ]; then
    probe "$runsc" "$KILN_GVISOR_PLATFORM" || die "gVisor: KILN_GVISOR_PLATFORM=$KILN_GVISOR_PLATFORM does not run a process within ${PROBE_TIMEOUT_S} s here"
    platform="$KILN_GVISOR_PLATFORM"
  elif [ -n "$recorded" ] && probe "$runsc" "$recorded"; then
    # The platform recorded before still works: no need to try (and wait for) the others again.
    platform="$recorded"
  else
    for p in "${PLATFORMS[@]}"; do
      offers "$runsc" "$p" || continue
      say "gVisor: trying platform $p (at most ${PROBE_TIMEOUT_S} s)"
      if probe "$runsc" "$p"; then platform="$p"; break; fi
    done
  fi
  [ -n "$platform" ] || { runc_only "no gVisor platform (${PLATFORMS[*]}) runs a process on this machine"; return 0; }

  local result slice="${KILN_GVISOR_SLICE_US:-300}"
  [[ "$slice" =~ ^[0-9]+$ ]] || die "KILN_GVISOR_SLICE_US=$slice is not a number of microseconds"
  if [ "$slice" != 0 ] && ! command -v perl >/dev/null 2>&1; then
    say "gVisor: no perl here, so its sandboxes keep the kernel's default CPU time slice"
    slice=0
  fi
  result="$(daemon_json "$DAEMON_JSON" "$runsc" "$platform" "$slice")"
  if [ "$result" = unchanged ]; then
    if gvisor_registered; then say "gVisor: kiln-gvisor and kiln-gvisor-nonet are registered (platform $platform)"
    else runc_only "the runtimes are in $DAEMON_JSON but the running dockerd has not loaded them (reload it: kill -HUP its pid, or systemctl reload docker)"; fi
    return 0
  fi
  say "gVisor: registered kiln-gvisor and kiln-gvisor-nonet (platform $platform) in $DAEMON_JSON"
  if ! started_by_us; then
    runc_only "the running dockerd was not started by this script, so it is left alone: reload it (kill -HUP its pid, or systemctl reload docker) to use gVisor"
    return 0
  fi
  # dockerd reloads its runtimes on SIGHUP (running containers keep running); restart it only if that did not take.
  local pid
  pid="$(cat "$PIDFILE")"
  say "reloading dockerd ($pid)"
  kill -HUP "$pid"
  for _ in $(seq 1 20); do gvisor_registered && return 0; sleep 0.5; done
  restart_dockerd "$pid" ""
  gvisor_registered || runc_only "dockerd does not report kiln-gvisor-nonet after a restart (see /var/log/kiln-dockerd.log)"
}

# The checkpoint API answers (a container that does not exist is "no such container", not "off").
# Asked, not read from `docker version`: a dockerd that took "experimental" from daemon.json by a
# reload reports it on, yet serves no checkpoint call until it is restarted.
experimental_on() {
  local out
  out="$(docker checkpoint ls kiln-checkpoint-probe-none 2>&1)" || true
  grep -qi 'no such container' <<<"$out"
}

# Pausing idle gVisor sandboxes to disk uses Docker's checkpoint API, which only a dockerd started
# with its experimental switch (set in daemon.json by daemon-json.ts) has: a reload does not turn it
# on, so a dockerd this script started is restarted (before Kiln runs: no sandbox is lost).
setup_checkpoints() {
  gvisor_registered || return 0
  if experimental_on; then say "checkpoints: dockerd's experimental API is on (idle gVisor sandboxes are paused to disk)"; return 0; fi
  if ! grep -q '"experimental": true' "$DAEMON_JSON" 2>/dev/null || ! started_by_us; then
    say "checkpoints: dockerd's experimental API is off, so idle gVisor sandboxes are removed rather than paused (set \"experimental\": true in $DAEMON_JSON and restart dockerd to pause them)"
    return 0
  fi
  restart_dockerd "$(cat "$PIDFILE")" " with its experimental API on (checkpoints)"
  experimental_on || say "checkpoints: dockerd still reports its experimental API off (see /var/log/kiln-dockerd.log); idle gVisor sandboxes are removed"
}

ensure_dockerd
setup_gvisor
setup_checkpoints
