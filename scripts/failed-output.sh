#!/usr/bin/env bash
# failed-output.sh LOG: prints, for every top-level test that failed in the
# `go test -v` log LOG, its own lines (from "=== RUN   TestX" to its
# "--- FAIL: TestX"), at most 400 per test. The integration target filters
# its live output to one line per message; on a failure this shows the rest
# (the connector's log a test prints with its t.Fatalf).
set -euo pipefail
log=$1
grep -oE '^--- FAIL: Test[^ ]+' "$log" | awk '{print $3}' | sort -u | while read -r name; do
  echo "==== output of $name"
  awk -v n="$name" '
    $0 == "=== RUN   " n { on = 1; count = 0 }
    on && count < 400 { print; count++ }
    on && index($0, "--- FAIL: " n " ") == 1 { on = 0 }
  ' "$log"
done
