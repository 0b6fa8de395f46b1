#!/usr/bin/env bash
# Debian packages the test suite needs: bubblewrap (sandbox isolation), util-linux (prlimit,
# setpriv), time (GNU time: CPU and peak RSS of sandboxed programs), chromium (the browser test
# of the Prefect UI, driven by Playwright).
# Idempotent; needs root (as on CI and the dev machines) or sudo.
set -euo pipefail
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v prlimit >/dev/null && command -v setpriv >/dev/null || need+=(util-linux)
[ -x /usr/bin/time ] || need+=(time)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
