#!/usr/bin/env bash
# Makes sure a Docker Engine answers on DOCKER_HOST or /var/run/docker.sock:
# installs docker.io when missing (root only) and starts dockerd in the background.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

docker_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && docker_up; then
  exit 0
fi
if [ -n "${DOCKER_HOST:-}" ]; then
  die "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST"
fi
if ! command -v dockerd >/dev/null 2>&1; then
  is_root || die "Docker Engine is not installed and this is not root: install docker.io (apt-get install docker.io) or point DOCKER_HOST at an engine"
  apt_install docker.io
fi
is_root || die "Docker Engine is installed but not running, and only root can start it here: start dockerd or point DOCKER_HOST at an engine"

say "starting dockerd (log: /var/log/kiln-dockerd.log)"
setsid nohup dockerd >/var/log/kiln-dockerd.log 2>&1 < /dev/null &
for _ in $(seq 1 120); do
  if [ -S /var/run/docker.sock ] && docker_up; then
    say "dockerd is up"
    exit 0
  fi
  sleep 0.5
done
tail -n 20 /var/log/kiln-dockerd.log >&2 || true
die "dockerd did not come up within 60 s (see /var/log/kiln-dockerd.log)"
