#!/usr/bin/env bash
# Stop the cluster scripts/start_postgres.sh started and delete its folder. Idempotent: nothing running, no error.
set -euo pipefail

DIR="${SPECTUNE_PG_DIR:-/tmp/spectune-pg}"
DATA="$DIR/data"

say() { echo "stop_postgres: $*" >&2; }

[[ -e "$DIR" ]] || { say "nothing to stop ($DIR does not exist)"; exit 0; }

# Only ever our own watchdog: the pid it recorded, if it still is that `sleep`-ing bash (its process group).
if [[ -f "$DIR/watchdog.pid" ]]; then
  pid="$(cat "$DIR/watchdog.pid")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && grep -q watchdog "/proc/$pid/cmdline" 2>/dev/null; then
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
  fi
fi

if [[ -f "$DATA/PG_VERSION" ]]; then
  BIN="${PG_BIN:-/usr/lib/postgresql/$(cat "$DATA/PG_VERSION")/bin}"
  [[ -x "$BIN/pg_ctl" ]] || BIN="$(dirname "$(command -v pg_ctl)")"
  if [[ "$(id -u)" == 0 ]]; then as_pg() { runuser -u postgres -- "$@"; }; else as_pg() { "$@"; }; fi
  if as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast -w -t 60 >/dev/null \
      || as_pg "$BIN/pg_ctl" -D "$DATA" stop -m immediate -w -t 30 >/dev/null
    say "stopped"
  fi
fi
rm -rf -- "$DIR"
