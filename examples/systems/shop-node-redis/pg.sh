#!/bin/sh
# pg.sh DIR PORT: a PostgreSQL server of the run's own, its data in DIR,
# listening on 127.0.0.1:PORT only (no Unix socket). The data directory is
# made on the first start and kept across a kill's restart. PostgreSQL
# refuses to run as root: as root it runs as the user postgres.
set -e
dir=$1 port=$2
[ -n "$dir" ] && [ -n "$port" ] || { echo "usage: pg.sh DIR PORT" >&2; exit 2; }
bin=
for b in /usr/lib/postgresql/*/bin; do [ -x "$b/initdb" ] && bin=$b; done
[ -n "$bin" ] || bin=$(dirname "$(command -v initdb)") || { echo "pg.sh: initdb not found (install postgresql)" >&2; exit 2; }
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}
if [ ! -f "$dir/PG_VERSION" ]; then
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system postgres
    chown postgres "$dir"
  fi
  as_owner "$bin/initdb" -D "$dir" -U postgres --auth=trust -E UTF8 >/dev/null
fi
set -- "$bin/postgres" -D "$dir" -p "$port" -c listen_addresses=127.0.0.1 -c unix_socket_directories= \
  -c max_connections=50 -c shared_buffers=32MB
if [ "$(id -u)" = 0 ]; then exec runuser -u postgres -- "$@"; fi
exec "$@"
