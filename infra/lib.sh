# Shared helpers for Kiln's install/start scripts. Sourced, not run.
set -euo pipefail

KILN_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '\033[36m[kiln]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[31m[kiln] error:\033[0m %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" = 0 ]; }

_apt_updated=""
# Installs Debian packages by name; refreshes the package lists once per script run.
apt_install() {
  is_root || die "need root to install: $* (install them yourself, or run as root)"
  if [ -z "$_apt_updated" ]; then
    say "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    _apt_updated=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

# Installs npm dependencies when node_modules is missing or older than the lockfile.
ensure_node_deps() {
  cd "$KILN_ROOT"
  local stamp=node_modules/.package-lock.json
  # A node_modules that is a link (a git worktree sharing another checkout's) is that checkout's to
  # install: npm ci here would empty the directory it points to, under everyone who uses it.
  if [ -L node_modules ]; then
    say "node_modules links to $(readlink node_modules): not installing here"
    return 0
  fi
  if [ ! -f "$stamp" ] || [ package-lock.json -nt "$stamp" ]; then
    say "installing npm dependencies (npm ci)"
    npm ci --no-audit --no-fund >&2
  fi
}

# Builds the ops dashboard (apps/dashboard → apps/dashboard/dist, served by the API at /).
build_dashboard() {
  say "building the dashboard"
  (cd "$KILN_ROOT" && npm run --silent dashboard:build >&2)
}
