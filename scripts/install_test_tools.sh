#!/usr/bin/env bash
# What the tests use besides Python packages: Debian's Chromium, for the test that opens the doctor's
# HTML report in a real headless browser (tests/doctor). Without root or apt-get those tests skip.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "setup: installing chromium for the browser tests (apt-get)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "setup: could not install chromium; the browser tests will skip"
else
  echo "setup: no chromium and no root apt-get; the browser tests will skip"
fi
