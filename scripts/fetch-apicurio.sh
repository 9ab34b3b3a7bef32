#!/usr/bin/env bash
# Fetch Apicurio Registry, the schema registry the contracts tests run
# (internal/testenv/registry.go), into .cache/apicurio/<version>/ (or
# $OUTBOX_CDC_APICURIO_DIR): Maven Central has the whole runnable Quarkus app
# as io.apicurio:apicurio-registry-app:<version>:tar.gz:all (109 MB). 3.0.9 is pinned
# because it runs on Java 17 (3.3.x needs 21+). Idempotent: a stamp file naming
# the version makes a second run return at once. Prints the app's directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="${OUTBOX_CDC_APICURIO_VERSION:-3.0.9}"
dir="${OUTBOX_CDC_APICURIO_DIR:-$root/.cache/apicurio/$version}"
artifact="io.apicurio:apicurio-registry-app:$version:tar.gz:all"
stamp="$dir/.complete"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  echo "$dir"
  exit 0
fi
for tool in java mvn tar; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fetch-apicurio: '$tool' not found; install it with: apt-get install openjdk-17-jre-headless maven" >&2
    exit 1
  fi
done

# Serialise concurrent runs (go test runs packages in parallel): the second
# one waits, then finds the stamp and returns.
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  echo "$dir"
  exit 0
fi

# Unpack into a fresh sibling and swap it in, so an interrupted run never
# leaves a half-filled directory that looks usable.
tmp="$dir.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
echo "fetch-apicurio: resolving $artifact with Maven" >&2
# dependency:get puts the artifact in the local repository (~/.m2). The
# default plugin version's parent POM is not always served by the mirror
# this runs behind; 2.8's is, so it is the fallback.
if ! mvn -q -B -Dstyle.color=never dependency:get -Dartifact="$artifact" -Dtransitive=false >&2; then
  echo "fetch-apicurio: retrying with maven-dependency-plugin 2.8" >&2
  mvn -q -B -Dstyle.color=never org.apache.maven.plugins:maven-dependency-plugin:2.8:get \
    -Dartifact="$artifact" -Dtransitive=false >&2
fi
# Where dependency:get put it: the local repository, which settings.xml may
# move (Maven colours even -q output on a terminal: strip the escapes).
repo="$(mvn -q -B -Dstyle.color=never help:evaluate -Dexpression=settings.localRepository -DforceStdout 2>/dev/null |
  sed 's/\x1b\[[0-9;]*m//g' || true)"
repo="${repo:-$HOME/.m2/repository}"
tarball="$repo/io/apicurio/apicurio-registry-app/$version/apicurio-registry-app-$version-all.tar.gz"
if [[ ! -f "$tarball" ]]; then
  echo "fetch-apicurio: Maven reported success but $tarball is missing" >&2
  exit 1
fi
tar -xzf "$tarball" -C "$tmp"
# 3.0.9 is a Quarkus legacy jar: apicurio-registry-app-<v>-runner.jar beside
# lib/, at the top of the tarball; later releases ship quarkus-app/quarkus-run.jar.
# internal/testenv/registry.go looks for either in the directory.
run="$(find "$tmp" -maxdepth 3 \( -name '*-runner.jar' -o -name quarkus-run.jar \) -print -quit)"
if [[ -z "$run" ]]; then
  echo "fetch-apicurio: no *-runner.jar or quarkus-run.jar in $tarball" >&2
  exit 1
fi
app="$(dirname "$run")"
echo "$version" >"$app/.complete"
rm -rf "$dir"
mv "$app" "$dir"
echo "$dir"
