#!/usr/bin/env bash
# `npm test`: start what the suite needs (dockerd, PostgreSQL), build the sandbox image, run vitest.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_node_deps
bash "$KILN_ROOT/infra/docker.sh"
bash "$KILN_ROOT/infra/postgres.sh"
cd "$KILN_ROOT"
node_modules/.bin/tsx sandbox-image/build.ts
say "type-check"
node_modules/.bin/tsc -p tsconfig.json
exec node_modules/.bin/vitest run "$@"
