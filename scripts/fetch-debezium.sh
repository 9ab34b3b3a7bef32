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

# shellcheck source=scripts/maven-libs.sh
source "$root/scripts/maven-libs.sh"
maven_libs fetch-debezium "$pom" "$libs" "$version"
