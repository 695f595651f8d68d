#!/usr/bin/env bash
# edge's CUDA checks and benchmarks on a machine with an NVIDIA GPU and no network (the device tool's machines).
#
# Needs python3 with torch (CUDA) and pytest. onnxruntime-gpu comes either installed or as a tarball of its
# `onnxruntime` package at .gpu/ortgpu.tar.xz (see benchmarks/gpu/README.md for how it is made small enough to carry);
# the kernel libraries are used when built (kernels/*.so), else built here. Logs and tables go to $OUT.
#
#   bash benchmarks/gpu/run.sh [setup|tests|bench|decode|profile|all] [extra args for the benchmark]
#   bash benchmarks/gpu/run.sh python SCRIPT [args]   (any script, in the same environment)
#
# decode runs benchmarks/gpu/decode_gpu.py on the GGUF at $GGUF (default /tmp/smollm2.gguf); it needs the gguf wheel
# in .gpu/whl when the machine has no gguf package.
set -uo pipefail
what=${1:-all}
shift || true
OUT=${OUT:-/tmp/edge-gpu-out}
mkdir -p "$OUT"
site=/tmp/edge-site
# The parts of benchmarks/gpu/pack_carry.sh: the first ones copied to /tmp by earlier calls, the rest carried.
if ls .gpu/p/p.* >/dev/null 2>&1 && [ ! -f /tmp/edge-parts.done ]; then
  parts=$(ls /tmp/p.* .gpu/p/p.* 2>/dev/null | xargs -n1 basename | sort -u)
  if ! { for n in $parts; do cat "$([ -f .gpu/p/$n ] && echo .gpu/p/$n || echo /tmp/$n)"; done | tar xf - \
         && (cd .gpu && sha256sum -c --quiet smollm2.sha256); }; then
    echo "the carried parts are incomplete: copy the first ones to /tmp first (benchmarks/gpu/README.md)"
    exit 1
  fi
  cp .gpu/smollm2.gguf /tmp/smollm2.gguf && touch /tmp/edge-parts.done
fi
if [ -f .gpu/ortgpu.tar.xz ] && [ ! -d $site/onnxruntime ]; then
  mkdir -p $site && tar xJf .gpu/ortgpu.tar.xz -C $site || exit 1
fi
if ls .gpu/whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target $site .gpu/whl/*.whl || exit 1
fi
[ "$what" = setup ] && exit 0
# The source tree maps edge.kernels -> kernels/ and so on (pyproject.toml); mirror that with links.
rm -rf /tmp/edge-pkg && mkdir -p /tmp/edge-pkg/edge
for f in edge/*; do ln -s "$PWD/$f" /tmp/edge-pkg/edge/; done
for d in export memory kernels apps profiles; do ln -s "$PWD/$d" "/tmp/edge-pkg/edge/$d"; done
export PYTHONPATH=$site:/tmp/edge-pkg:$PWD/tests
export PYTHONSAFEPATH=1  # never the checkout's edge/ (it lacks edge.kernels & co.), in subprocesses too
# onnxruntime-gpu and the kernels link CUDA 13's cudart/cuBLAS/cuRAND: take them from the pip packages torch uses.
libs=$(python3 -c '
import glob, os, site
dirs = {os.path.dirname(f) for base in site.getsitepackages()
        for f in glob.glob(os.path.join(base, "nvidia", "**", "lib*.so*"), recursive=True)}
print(":".join(sorted(dirs)))')
export LD_LIBRARY_PATH=$libs:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
lscpu | grep -E "Model name|Flags" | cut -c1-300 >> "$OUT/gpu.txt"
python3 -c "import onnxruntime as o, torch; print('onnxruntime', o.__version__, o.get_available_providers(), 'torch', torch.__version__)" \
  | tee -a "$OUT/gpu.txt"
[ -f kernels/libedge_kernels_cuda.so ] || python3 kernels/build.py || exit 1
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py tests/test_kernels.py tests/test_kernels_norm.py \
    tests/test_kernels_projection.py tests/test_kernels_attention.py 2>&1 | tee "$OUT/pytest.log" | tail -15
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  PYTHONUNBUFFERED=1 python3 benchmarks/kernels_cuda.py --out "$OUT/kernels_cuda.md" "$@" > "$OUT/bench.log" 2>&1 \
    || { tail -30 "$OUT/bench.log"; status=1; }
  tail -40 "$OUT/kernels_cuda.md" 2>/dev/null
fi
if [ "$what" = decode ] || [ "$what" = all ]; then
  PYTHONUNBUFFERED=1 python3 benchmarks/gpu/decode_gpu.py --gguf "${GGUF:-/tmp/smollm2.gguf}" --out "$OUT/decode_gpu.md" \
    "$@" 2>&1 | tee "$OUT/decode.log" | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ "$what" = python ]; then
  PYTHONUNBUFFERED=1 python3 "$@" 2>&1 | tee "$OUT/python.log"
  status=${PIPESTATUS[0]}
fi
if [ "$what" = profile ]; then
  PYTHONUNBUFFERED=1 python3 benchmarks/gpu/spec_profile.py 2>&1 | tee "$OUT/profile.log" | tail -12
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
