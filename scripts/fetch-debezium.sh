#!/usr/bin/env bash
# Fetch Kafka Connect and the Debezium PostgreSQL connector (with its Outbox
# EventRouter), the contender of `make bench`, into .cache/debezium/libs (or
# $OUTBOX_BENCH_DEBEZIUM_LIBS). Idempotent: a stamp file naming the pinned
# versions makes a second run return immediately. The benchmark skips
# Debezium, saying so in its report, when this fails.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pom="$root/tools/debezium/pom.xml"
libs="${OUTBOX_BENCH_DEBEZIUM_LIBS:-$root/.cache/debezium/libs}"

# Keep the versions in one place: the pom.
debezium="$(sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$pom")"
kafka="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")"
if [[ -z "$debezium" || -z "$kafka" ]]; then
  echo "fetch-debezium: cannot read debezium.version and kafka.version from $pom" >&2
  exit 1
fi
version="debezium-$debezium connect-$kafka"
stamp="$libs/.complete"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  exit 0
fi

mkdir -p "$(dirname "$libs")"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$libs.lock"
  flock 9
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    exit 0
  fi
fi

for tool in java mvn; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fetch-debezium: '$tool' not found; install it with: apt-get install openjdk-17-jre-headless maven" >&2
    exit 1
  fi
done

# A fresh sibling directory swapped in, as in fetch-kafka.sh: never a
# half-filled libs dir that looks usable.
tmp="$libs.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
echo "fetch-debezium: resolving $version with Maven into $libs" >&2
mvn -q -B -Dstyle.color=never -f "$pom" \
  dependency:copy-dependencies \
  -DoutputDirectory="$tmp" \
  -DincludeScope=runtime
echo "$version" >"$tmp/.complete"
rm -rf "$libs"
mv "$tmp" "$libs"
echo "fetch-debezium: $(ls "$libs"/*.jar | wc -l) jars in $libs" >&2
