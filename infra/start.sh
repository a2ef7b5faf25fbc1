#!/usr/bin/env bash
# `npm start`: install what is missing, build the sandbox image and the dashboard, start the API.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ensure_node_deps
bash "$KILN_ROOT/infra/docker.sh"
cd "$KILN_ROOT"
node_modules/.bin/tsx sandbox-image/build.ts
build_dashboard
exec node --import tsx apps/api/src/main.ts
