#!/usr/bin/env bash
# Provides PgBouncer in transaction pooling mode in front of the PostgreSQL server of
# hack/postgres.sh, for the tests that must pass behind a pooler, and prints a URL through it on
# stdout (the server URL's user, database and query, on 127.0.0.1:$SEQINBOX_PGBOUNCER_PORT).
#
# PgBouncer comes from the installed binary or, when root on Debian, from Debian's pgbouncer package
# (1.18 on bookworm: no prepared statements in transaction mode). Its files live under the cache
# (~/.cache/seqinbox/pgbouncer/<port>, or /var/lib/seqinbox/pgbouncer/<port> as root, where it runs
# as the postgres user because it refuses to run as root). The configuration is written on every
# call; a running PgBouncer of that port reloads it. Environment:
#   SEQINBOX_PGBOUNCER_PORT       listen port (default 6432)
#   SEQINBOX_PGBOUNCER_POOL_SIZE  server connections per database and user (default 12)
# Every database name is served (a `*` entry), so tests can create and use databases of their own.
# `hack/pgbouncer.sh stop` stops the PgBouncer of that port and removes its files. Progress goes to
# stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${SEQINBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/seqinbox}
port=${SEQINBOX_PGBOUNCER_PORT:-6432}
pool_size=${SEQINBOX_PGBOUNCER_POOL_SIZE:-12}
dir=$cache/pgbouncer/$port
# As root PgBouncer runs as the postgres user, who cannot enter root's home: keep it in /var/lib.
[ "$(id -u)" = 0 ] && dir=/var/lib/seqinbox/pgbouncer/$port
pidfile=$dir/pgbouncer.pid
log() { echo "pgbouncer: $*" >&2; }

# as_owner runs a command as the non-root user PgBouncer runs as.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

if [ "${1:-}" = stop ]; then
  if running; then
    pid=$(cat "$pidfile")
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { log "PgBouncer (pid $pid) did not stop"; exit 1; }
    log "stopped PgBouncer on 127.0.0.1:$port"
  fi
  # Its configuration is written anew at every start: nothing of a stopped one is kept.
  rm -rf "$dir"
  exit 0
fi

# The server and the parts of its URL: postgres://user[:password]@host[:port]/database[?query].
server=$("$here/postgres.sh")
re='^postgres(ql)?://([^:@/]+)(:([^@/]*))?@([^:/?]+)(:([0-9]+))?/([^?]*)(\?(.*))?$'
if [[ ! $server =~ $re ]]; then
  log "cannot read user, host and database from the server URL of hack/postgres.sh"
  exit 1
fi
user=${BASH_REMATCH[2]} password=${BASH_REMATCH[4]} host=${BASH_REMATCH[5]}
server_port=${BASH_REMATCH[7]:-5432} database=${BASH_REMATCH[8]:-postgres} query=${BASH_REMATCH[10]}
if [ "$server_port" = "$port" ]; then
  log "the server URL points at port $port, where PgBouncer itself listens; unset SEQINBOX_TEST_DATABASE_URL or set SEQINBOX_PGBOUNCER_PORT"
  exit 1
fi
url="postgres://$user@127.0.0.1:$port/$database${query:+?$query}"

if ! command -v pgbouncer >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "no pgbouncer found; installing Debian's pgbouncer package"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pgbouncer >&2; }
  else
    log "PgBouncer is not installed; install it (Debian: apt-get install pgbouncer)"
    exit 1
  fi
fi
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --home-dir /var/lib/postgresql --shell /usr/sbin/nologin postgres
fi

mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
# Trust: PgBouncer checks no password, but a user must be listed in the auth_file to be served.
printf '"%s" ""\n' "$user" | as_owner tee "$dir/userlist.txt" >/dev/null
as_owner tee "$dir/pgbouncer.ini" >/dev/null <<EOF
; Written by hack/pgbouncer.sh on every call; edits are lost.
[databases]
* = host=$host port=$server_port user=$user${password:+ password=$password}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
pool_mode = transaction
default_pool_size = $pool_size
max_client_conn = 1000
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = $user
ignore_startup_parameters = extra_float_digits
server_reset_query =
logfile = $dir/pgbouncer.log
pidfile = $pidfile
EOF

# answers: true when a SQL query through PgBouncer succeeds (psql if installed, else a TCP connect).
answers() {
  if command -v psql >/dev/null 2>&1; then
    psql "$url" -XAtqc 'select 1' >/dev/null 2>&1
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
  fi
}

if running; then
  kill -HUP "$(cat "$pidfile")"
else
  log "starting PgBouncer (transaction pooling, $pool_size server connections per database) on 127.0.0.1:$port"
  as_owner pgbouncer -d "$dir/pgbouncer.ini" >&2
fi
for _ in $(seq 50); do answers && break; sleep 0.1; done
answers || { log "PgBouncer does not answer on 127.0.0.1:$port; see $dir/pgbouncer.log"; exit 1; }
echo "$url"
