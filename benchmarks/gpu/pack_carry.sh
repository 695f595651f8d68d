#!/usr/bin/env bash
# Everything a GPU run needs, in 52 MiB parts that each fit one device-tool call (64 MiB with the ~7 MiB tree):
# onnxruntime-gpu packed for sm_90, the default GGUF and its sha256, the gguf wheel, both kernel libraries.
#
#   bash benchmarks/gpu/pack_carry.sh ONNXRUNTIME_GPU_WHEEL GGUF GGUF_WHEEL    (writes .gpu/p/p.00, p.01, ...)
#
# Then, one call after another (the machine stays warm 30 s): carry .gpu/p/p.00 and run `cp .gpu/p/p.00 /tmp/`; the
# same for p.01; carry the rest and run `bash benchmarks/gpu/run.sh tests` (run.sh joins the parts on its first call
# there; benchmarks/gpu/README.md).
set -euo pipefail
wheel=$1 gguf=$2 gguf_wheel=$3
mkdir -p .gpu/whl .gpu/p
python benchmarks/gpu/pack_onnxruntime.py "$wheel" .gpu/ortgpu.tar.xz --sm 90
python -c "from kernels import build; build.build_cpu(); build.build_cuda(archs=['90'])"
cp "$gguf" .gpu/smollm2.gguf
(cd .gpu && sha256sum smollm2.gguf > smollm2.sha256)
cp "$gguf_wheel" .gpu/whl/
rm -f .gpu/p/p.*
tar cf - .gpu/ortgpu.tar.xz .gpu/smollm2.gguf .gpu/smollm2.sha256 .gpu/whl kernels/libedge_kernels.so \
  kernels/libedge_kernels_cuda.so | split -b 52M -d - .gpu/p/p.
rm .gpu/ortgpu.tar.xz .gpu/smollm2.gguf
ls -l .gpu/p
