#!/usr/bin/env bash
# Replace Pillow with Pillow-SIMD in the environment of the given python (default: ./.venv).
# Pillow-SIMD is a drop-in fork of Pillow (same PIL package) with SIMD resize and filters, 4-8x faster.
# If it cannot be built, Pillow stays, with a clear message: PIL is never left broken.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-.venv/bin/python}
version=${PILLOW_SIMD_VERSION:-12.1.1.post0}
cache="$(dirname "$(dirname "$py")")/pillow-simd-wheels"

if "$py" -c "import sys; from fastloader.info import pil_flavor; sys.exit(pil_flavor()[0] != 'Pillow-SIMD')" 2>/dev/null; then
  exit 0
fi

if ! ls "$cache"/pillow_simd-"$version"-*.whl >/dev/null 2>&1; then
  cc_flags=""
  if grep -q -m1 avx2 /proc/cpuinfo 2>/dev/null; then cc_flags="-mavx2"; fi
  echo "pillow-simd: building $version from source (CC='cc $cc_flags', about a minute)"
  mkdir -p "$cache"
  if ! CC="cc $cc_flags" "$py" -m pip wheel -q --no-deps --no-binary :all: "pillow-simd==$version" -w "$cache"; then
    echo "pillow-simd: WARNING: the build failed; keeping Pillow (decode works, resize is slower)."
    exit 0
  fi
fi

wheel=$(ls "$cache"/pillow_simd-"$version"-*.whl | head -n1)
# Uninstall Pillow first: uninstalling it after would delete the PIL files both packages share.
"$py" -m pip uninstall -q -y pillow >/dev/null 2>&1 || true
if "$py" -m pip install -q --no-deps --force-reinstall "$wheel" \
   && "$py" -c "from PIL import Image; Image.new('RGB', (64, 64)).resize((7, 7), Image.BILINEAR)"; then
  echo "pillow-simd: installed $version (pip check will name torchvision's 'pillow' requirement: Pillow-SIMD provides the same PIL)"
else
  echo "pillow-simd: WARNING: the installed wheel does not work; restoring Pillow."
  "$py" -m pip uninstall -q -y pillow-simd >/dev/null 2>&1 || true
  "$py" -m pip install -q --force-reinstall pillow
fi
