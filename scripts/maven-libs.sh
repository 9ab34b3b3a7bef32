# Sourced by scripts/fetch-*.sh: resolve a pom's runtime dependencies with
# Maven into a libs directory, once per pinned version.
#
# maven_libs NAME POM LIBS VERSION: idempotent (a stamp file naming VERSION
# makes a second call return at once), serialised between concurrent callers
# (flock), and never leaves a half-filled LIBS that looks usable.

maven_libs() {
  local name="$1" pom="$2" libs="$3" version="$4"
  local stamp="$libs/.complete"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
    return 0
  fi

  # Serialise concurrent runs (go test runs packages in parallel): the second
  # one waits, then finds the stamp and returns.
  mkdir -p "$(dirname "$libs")"
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$libs.lock"
    flock 9
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
      return 0
    fi
  fi

  local tool
  for tool in java mvn; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "$name: '$tool' not found; install it with: apt-get install openjdk-17-jre-headless maven" >&2
      return 1
    fi
  done

  # Copy into a fresh sibling directory and swap it in, so an interrupted run
  # never leaves a half-filled libs dir that looks usable, and jars of an older
  # pinned version do not linger on the classpath.
  local tmp="$libs.tmp.$$"
  trap 'rm -rf "'"$tmp"'"' EXIT
  rm -rf "$tmp"
  mkdir -p "$tmp"
  echo "$name: resolving $version with Maven into $libs" >&2
  mvn -q -B -Dstyle.color=never -f "$pom" \
    dependency:copy-dependencies \
    -DoutputDirectory="$tmp" \
    -DincludeScope=runtime
  echo "$version" >"$tmp/.complete"
  rm -rf "$libs"
  mv "$tmp" "$libs"
  echo "$name: $(ls "$libs"/*.jar | wc -l) jars in $libs" >&2
}
