#!/usr/bin/env bash
# The second environment of the tests: MosaicML streaming pins numpy < 2.2, which the project's own .venv does
# not hold, so tests/integrations/test_mosaic_streaming.py runs its loaders in ./.venv-streaming (fastloader
# from this checkout through PYTHONPATH, its C extension as `make setup` built it). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-streaming
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}
WANT="mosaicml-streaming==0.13.0 numpy<2.2 lmdb>=1.4 crc32c>=2.4 tqdm>=4.60 psutil>=5.9"

stamp="$VENV/.fastloader-streaming"
want=$(printf '%s %s %s' "$TORCH_SPEC" "$WANT" "$($PYTHON --version 2>&1)" | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import streaming, torch" 2>/dev/null; then
  exit 0
fi
echo "setup: the MosaicML streaming test environment ($VENV)"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q $TORCH_SPEC $WANT
echo "$want" > "$stamp"
