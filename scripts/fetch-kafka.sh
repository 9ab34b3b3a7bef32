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

# shellcheck source=scripts/maven-libs.sh
source "$root/scripts/maven-libs.sh"
maven_libs fetch-kafka "$pom" "$libs" "$version"
