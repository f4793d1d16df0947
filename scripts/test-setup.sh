#!/usr/bin/env bash
# What `make test` needs beyond the virtual environment: Debian's chromium (the browser tests
# drive it through Playwright; no browser is ever downloaded) and iproute2's ip and tc (the
# network-namespace testbed tests, which also need root).
#
# As root with apt-get (CI's .ci/run, a fresh container), the missing packages are installed,
# saying so in one line. Otherwise, or with NO_APT=1, nothing is installed and one line says
# which tests will skip and why. It never fails the run: the tests skip with their reason.
set -u

missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
  || missing+=(chromium)
{ command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; } || missing+=(iproute2)
root=0
[ "$(id -u)" = 0 ] && root=1

if [ ${#missing[@]} -gt 0 ] && [ "$root" = 1 ] && [ "${NO_APT:-0}" != 1 ] \
   && command -v apt-get >/dev/null 2>&1; then
  echo "make test: installing ${missing[*]} with apt-get (browser tests: chromium; testbed tests: ip, tc; NO_APT=1 skips this)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 \
    || echo "make test: apt-get install ${missing[*]} failed" >&2
  missing=()
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 \
    || missing+=(chromium)
  { command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; } || missing+=(iproute2)
fi

why=()
for pkg in "${missing[@]}"; do
  case "$pkg" in
    chromium) why+=("the browser tests (-m browser): Debian's chromium is missing (apt-get install -y chromium)") ;;
    iproute2) why+=("the testbed tests (-m netns): ip/tc are missing (apt-get install -y iproute2)") ;;
  esac
done
if [ "$root" = 0 ]; then
  why+=("the testbed tests (-m netns): they need root for network namespaces")
fi
if [ ${#why[@]} -gt 0 ]; then
  line="make test: will skip"
  sep=" "
  for w in "${why[@]}"; do line+="$sep$w"; sep="; "; done
  echo "$line" >&2
fi
exit 0
