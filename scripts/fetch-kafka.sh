#!/usr/bin/env bash
# Fetch the Apache Kafka broker jars used by the integration tests into
# .cache/kafka/libs (or $OUTBOX_CDC_KAFKA_LIBS). Idempotent: a stamp file
# naming the pinned version makes a second run return immediately.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pom="$root/tools/kafka/pom.xml"
libs="${OUTBOX_CDC_KAFKA_LIBS:-$root/.cache/kafka/libs}"

# Keep the version in one place: the pom.
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")"
if [[ -z "$version" ]]; then
  echo "fetch-kafka: cannot read kafka.version from $pom" >&2
  exit 1
fi
stamp="$libs/.complete"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  exit 0
fi

# Serialise concurrent runs (go test runs packages in parallel): the second
# one waits, then finds the stamp and exits.
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
    echo "fetch-kafka: '$tool' not found; install it with: apt-get install openjdk-17-jre-headless maven" >&2
    exit 1
  fi
done

# Copy into a fresh sibling directory and swap it in, so an interrupted run
# never leaves a half-filled libs dir that looks usable, and jars of an older
# pinned version do not linger on the classpath.
tmp="$libs.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp"
echo "fetch-kafka: resolving Apache Kafka $version with Maven into $libs" >&2
mvn -q -B -Dstyle.color=never -f "$pom" \
  dependency:copy-dependencies \
  -DoutputDirectory="$tmp" \
  -DincludeScope=runtime
echo "$version" >"$tmp/.complete"
rm -rf "$libs"
mv "$tmp" "$libs"
echo "fetch-kafka: $(ls "$libs"/*.jar | wc -l) jars in $libs" >&2
