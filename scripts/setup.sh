#!/usr/bin/env bash
# Install fastloader and everything it uses into ./.venv, on a fresh machine or an existing one.
# Idempotent: when nothing it depends on changed, it returns in about a second.
#   PYTHON=python3.11 scripts/setup.sh     # which interpreter makes the venv
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# torch 2.14.1 / torchvision 0.29.1 are the builds this project is tested with (they lie on the
# build machines' local disk, so pip takes them without a multi-GB download).
TORCH_SPEC=${TORCH_SPEC:-"torch==2.14.1 torchvision==0.29.1"}

stamp="$VENV/.fastloader-setup"
want=$(cat pyproject.toml scripts/setup.sh scripts/install_pillow_simd.sh fastloader/image/_jpeg.c fastloader/image/_resample.c fastloader/image/_resample.h | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$VENV/bin/python" -c "import fastloader, torch, torchvision, PIL, lmdb, sphinx" 2>/dev/null; then
  exit 0
fi

# Pillow-SIMD compiles against libjpeg-turbo and zlib headers.
if [ ! -f /usr/include/jpeglib.h ] || [ ! -f /usr/include/zlib.h ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "setup: installing libjpeg-turbo and zlib headers (apt-get)"
    apt-get update -qq && apt-get install -y -qq libjpeg62-turbo-dev zlib1g-dev >/dev/null \
      || apt-get install -y -qq libjpeg-turbo8-dev zlib1g-dev >/dev/null \
      || echo "setup: could not install the headers; Pillow-SIMD may fall back to Pillow"
  else
    echo "setup: libjpeg/zlib headers missing and no root apt-get; Pillow-SIMD may fall back to Pillow"
  fi
fi

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
py="$VENV/bin/python"
echo "setup: installing $TORCH_SPEC and fastloader[test,docs] into $VENV"
# shellcheck disable=SC2086
"$py" -m pip install -q $TORCH_SPEC
"$py" -m pip install -q -e ".[test,docs]"
# Last, because any pip install that pulls torchvision re-installs Pillow over Pillow-SIMD.
bash scripts/install_pillow_simd.sh "$py"
echo "$want" > "$stamp"
"$VENV/bin/fastloader" info
