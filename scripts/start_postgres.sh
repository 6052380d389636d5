#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster for the store's PostgreSQL tests; print its SQLAlchemy URL.
#
#   export SPECTUNE_TEST_PG_URL="$(scripts/start_postgres.sh)"   # ... run tests ...   scripts/stop_postgres.sh
#
# Installs nothing: it needs Debian's `postgresql` package (or initdb/pg_ctl on PATH). The cluster lives in
# $SPECTUNE_PG_DIR (default /tmp/spectune-pg), runs as the `postgres` user when started by root, listens on
# 127.0.0.1 only (no other address, no Unix socket outside that folder) on a free port, trusts local TCP
# logins, and has a database `spectune_test`. Idempotent: when the cluster is already up it only prints the
# URL. As a safety net it stops itself after $SPECTUNE_PG_TTL_S seconds (default 3 hours; 0 = never) if
# scripts/stop_postgres.sh is never run. Only the URL goes to stdout; progress goes to stderr.
set -euo pipefail

DIR="${SPECTUNE_PG_DIR:-/tmp/spectune-pg}"
TTL="${SPECTUNE_PG_TTL_S:-10800}"
DB=spectune_test
DATA="$DIR/data"

say() { echo "start_postgres: $*" >&2; }
die() { say "$*"; exit 1; }

find_bin() {
  if [[ -n "${PG_BIN:-}" ]]; then echo "$PG_BIN"; return; fi
  local newest
  newest="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [[ -n "$newest" && -x "$newest/initdb" ]]; then echo "$newest"; return; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  die "PostgreSQL server binaries not found (apt-get install postgresql, or set PG_BIN)"
}
BIN="$(find_bin)"

# The server refuses to run as root: root runs it as `postgres`; anyone else runs it as themselves.
if [[ "$(id -u)" == 0 ]]; then
  id postgres >/dev/null 2>&1 || die "no 'postgres' user (is the postgresql package installed?)"
  as_pg() { runuser -u postgres -- "$@"; }
  OWNER=postgres
else
  as_pg() { "$@"; }
  OWNER="$(id -un)"
fi

url() { echo "postgresql+psycopg://postgres@127.0.0.1:$1/$DB"; }
running() { [[ -f "$DATA/PG_VERSION" ]] && as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if running && [[ -f "$DIR/port" ]]; then
  port="$(cat "$DIR/port")"
  if as_pg "$BIN/psql" -h 127.0.0.1 -p "$port" -U postgres -d "$DB" -tAc 'SELECT 1' >/dev/null 2>&1; then
    say "already running on 127.0.0.1:$port ($DIR)"
    url "$port"
    exit 0
  fi
  die "a cluster runs in $DIR but database $DB does not answer on port $port; run scripts/stop_postgres.sh"
fi

# Anything left from an earlier run that is not running is stale: start over.
if [[ -e "$DIR" ]]; then
  if [[ -f "$DATA/PG_VERSION" ]]; then as_pg "$BIN/pg_ctl" -D "$DATA" stop -m immediate >/dev/null 2>&1 || true; fi
  rm -rf -- "$DIR"
fi
mkdir -p "$DIR"
chmod 700 "$DIR"
chown "$OWNER" "$DIR"

say "initdb in $DATA ($BIN)"
as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1 \
  || as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust --encoding=UTF8 --locale=C >"$DIR/initdb.log" 2>&1 \
  || { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
# Only local TCP on 127.0.0.1 is allowed in, with trust; nothing else (the default file also trusts ::1).
cat >"$DATA/pg_hba.conf" <<HBA
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
HBA

started=""
for port in $(seq 54329 54429); do
  port_busy "$port" && continue
  if as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DIR/server.log" -w -t 60 start \
      -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$DIR -c fsync=off \
          -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" >/dev/null 2>&1; then
    started="$port"
    break
  fi
  say "port $port did not work, trying the next one"
  as_pg "$BIN/pg_ctl" -D "$DATA" stop -m immediate >/dev/null 2>&1 || true
done
[[ -n "$started" ]] || { tail -n 20 "$DIR/server.log" >&2 || true; die "could not start PostgreSQL on any port"; }
echo "$started" >"$DIR/port"

as_pg "$BIN/psql" -h 127.0.0.1 -p "$started" -U postgres -d postgres -v ON_ERROR_STOP=1 -qc "CREATE DATABASE $DB" >&2 \
  || { as_pg "$BIN/pg_ctl" -D "$DATA" stop -m fast >/dev/null 2>&1 || true; die "could not create database $DB"; }

if [[ "$TTL" != 0 ]]; then
  # Safety net, detached from the caller's terminal and pipes (so `$(start_postgres.sh)` returns at once).
  setsid bash -c 'sleep "$1"; runas=(); [[ "$(id -u)" == 0 ]] && runas=(runuser -u postgres --);
                  "${runas[@]}" "$2/pg_ctl" -D "$3/data" stop -m fast; rm -rf -- "$3"' \
    watchdog "$TTL" "$BIN" "$DIR" </dev/null >/dev/null 2>&1 &
  echo $! >"$DIR/watchdog.pid"
fi

say "PostgreSQL $("$BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$started, data in $DATA"
url "$started"
