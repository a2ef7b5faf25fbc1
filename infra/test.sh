#!/usr/bin/env bash
# `npm test`: start what the suite needs (dockerd, PostgreSQL, Debian's chromium for the browser
# tests), build the sandbox image and the dashboard, type-check, lint (`npm run lint`), run vitest.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_node_deps
[ -x /usr/bin/chromium ] || apt_install chromium
# The egress test signs its upstream servers' certificates with openssl.
command -v openssl >/dev/null 2>&1 || apt_install openssl
bash "$KILN_ROOT/infra/docker.sh"
bash "$KILN_ROOT/infra/postgres.sh"
cd "$KILN_ROOT"
node_modules/.bin/tsx sandbox-image/build.ts
build_dashboard
say "type-check"
node_modules/.bin/tsc -p tsconfig.json
node_modules/.bin/tsc -p apps/dashboard/tsconfig.json
say "lint (biome: format and lint rules; knip: unused files, exports and dependencies)"
npm run --silent lint
exec node_modules/.bin/vitest run "$@"
