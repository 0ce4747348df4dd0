#!/usr/bin/env bash
# Provides a PostgreSQL server for tests and the demo (docs/design.md#development-environment) and prints its URL on stdout.
#
# Order: $SEQINBOX_TEST_DATABASE_URL if it answers; else a server on 127.0.0.1:5432; else a
# private server started from installed PostgreSQL binaries under the cache
# (~/.cache/seqinbox/postgres, or /var/lib/seqinbox/postgres as root; port $SEQINBOX_PG_PORT, default 55432);
# else, when root on Debian, install PostgreSQL with apt-get and start the private server.
# SEQINBOX_PG_PRIVATE=1 skips the discovery and uses the private server (to test that path).
# `hack/postgres.sh stop` stops the private server. Progress goes to stderr.
set -euo pipefail

cache=${SEQINBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seqinbox}
pgdir=$cache/postgres
# As root the server runs as the postgres user, who cannot enter root's home: keep it in /var/lib.
[ "$(id -u)" = 0 ] && pgdir=/var/lib/seqinbox/postgres
data=$pgdir/data
port=${SEQINBOX_PG_PORT:-55432}
log() { echo "postgres: $*" >&2; }

# answers URL: true when a SQL query succeeds (psql if installed, else a TCP connect).
answers() {
  if command -v psql >/dev/null 2>&1; then
    psql "$1" -XAtqc 'select 1' >/dev/null 2>&1
  else
    local hostport=${1#*@}; hostport=${hostport%%/*}
    (exec 3<>"/dev/tcp/${hostport%:*}/${hostport#*:}") 2>/dev/null
  fi
}

bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin; do
    [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v pg_ctl >/dev/null 2>&1 && { dirname "$(command -v pg_ctl)"; return 0; }
  return 1
}

# as_owner runs a command as the non-root owner of the private server (initdb refuses root).
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start_private() {
  local bin
  if ! bin=$(bindir); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "no PostgreSQL binaries found; installing Debian's postgresql package (a minute or two)"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 ||
        { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; }
      bin=$(bindir)
    else
      log "no PostgreSQL server answers and none is installed."
      log "install PostgreSQL (Debian: apt-get install postgresql) or set SEQINBOX_TEST_DATABASE_URL"
      exit 1
    fi
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
  fi
  mkdir -p "$pgdir"
  if [ "$(id -u)" = 0 ]; then chown postgres "$pgdir"; fi
  if [ ! -s "$data/PG_VERSION" ]; then
    log "initialising a private PostgreSQL cluster in $data"
    as_owner "$bin/initdb" -D "$data" -U postgres -A trust -E UTF8 >/dev/null
  fi
  log "starting the private PostgreSQL server on 127.0.0.1:$port"
  as_owner "$bin/pg_ctl" -D "$data" -l "$pgdir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k /tmp -c max_connections=300 -c fsync=off" start >/dev/null
}

if [ "${1:-}" = stop ]; then
  bin=$(bindir) && [ -s "$data/PG_VERSION" ] && as_owner "$bin/pg_ctl" -D "$data" -m fast stop >&2 || true
  exit 0
fi

if [ "${SEQINBOX_PG_PRIVATE:-0}" != 1 ]; then
  if [ -n "${SEQINBOX_TEST_DATABASE_URL:-}" ]; then
    if answers "$SEQINBOX_TEST_DATABASE_URL"; then
      echo "$SEQINBOX_TEST_DATABASE_URL"
      exit 0
    fi
    log "SEQINBOX_TEST_DATABASE_URL does not answer; fix or unset it"
    exit 1
  fi
  url="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
  if answers "$url"; then
    echo "$url"
    exit 0
  fi
  log "no server on 127.0.0.1:5432"
fi

url="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
if ! answers "$url"; then
  start_private
fi
answers "$url" || { log "the private server did not come up; see $pgdir/server.log"; exit 1; }
echo "$url"
