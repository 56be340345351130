#!/bin/sh
# First start: initdb, listen on every address, and let the network in (with a
# password when POSTGRES_PASSWORD is set, without one otherwise: the container's
# network is private to the run). Later starts, after a kill, go straight to the
# server, which recovers from its WAL. fsync stays on: the durability faults
# need it.
set -eu
user="${POSTGRES_USER:-postgres}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb -D "$PGDATA" -U "$user" -E UTF8 --auth-local=trust --auth-host=scram-sha-256 --pwfile="$pwfile" >/dev/null
    rm -f "$pwfile"
    method=scram-sha-256
  else
    initdb -D "$PGDATA" -U "$user" -E UTF8 --auth=trust >/dev/null
    method=trust
  fi
  printf 'host all all 0.0.0.0/0 %s\nhost all all ::/0 %s\n' "$method" "$method" >> "$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
    postgres --single -D "$PGDATA" postgres <<SQL >/dev/null
CREATE DATABASE "$POSTGRES_DB";
SQL
  fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' -c max_connections="${POSTGRES_MAX_CONNECTIONS:-300}" "$@"
