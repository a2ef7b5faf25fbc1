#!/usr/bin/env bash
# Makes sure PostgreSQL answers on 127.0.0.1:5432 (the test suite's server):
# starts the Debian cluster when it is down, installs it when it is missing.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

command -v pg_isready >/dev/null 2>&1 && pg_up && exit 0
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  apt_install postgresql
fi
version="$(ls /etc/postgresql | sort -V | tail -n 1)"
say "starting PostgreSQL $version"
pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
for _ in $(seq 1 60); do
  pg_up && exit 0
  sleep 0.5
done
die "PostgreSQL did not answer on 127.0.0.1:5432 within 30 s"
