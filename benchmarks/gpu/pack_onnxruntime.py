"""Make onnxruntime-gpu small enough to carry to a GPU machine without network (the device tool: 64 MiB per call).

The wheel is 256 MB, most of it libonnxruntime_providers_cuda.so's GPU code compiled for six architectures. Only the
target GPU's machine code is needed, so the other architectures' entries are overwritten with zeros (the fatbin
headers stay intact, so the CUDA runtime still finds and loads the right one), then xz squeezes the zeros away. The C
API library (libonnxruntime.so, which the Python module does not load), the TensorRT provider and the Python tools
are left out. For an H100/H200 (sm_90): a 57 MiB tarball of the `onnxruntime` package.

    pip download --no-deps --python-version 3.12 --only-binary=:all: --platform manylinux_2_28_x86_64 \
        onnxruntime-gpu==1.31.1 -d /tmp/whl
    python benchmarks/gpu/pack_onnxruntime.py /tmp/whl/onnxruntime_gpu-1.31.1-*.whl .gpu/ortgpu.tar.xz --sm 90

benchmarks/gpu/run.sh unpacks .gpu/ortgpu.tar.xz onto PYTHONPATH.
"""

from __future__ import annotations

import argparse
import os
import struct
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
CUDA_PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
LEAVE_OUT = ("onnxruntime/capi/libonnxruntime.so", "onnxruntime/capi/libonnxruntime_providers_tensorrt.so",
             "onnxruntime/transformers/", "onnxruntime/quantization/", "onnxruntime/tools/",
             "onnxruntime/ThirdPartyNotices.txt")


def fatbin_entries(buf: bytes | bytearray) -> Iterator[tuple[int, int, int]]:
    """(payload offset, payload size, sm version) of every entry of every fatbin container in an ELF file.

    A container: magic (u32), version (u16), header size (u16, 16), size of the entries (u64). An entry: kind (u16),
    version (u16), header size (u32), padded payload size (u32) at offset 8, SM version (u32) at offset 28."""
    pos = 0
    while (pos := buf.find(struct.pack("<I", FATBIN_MAGIC), pos)) >= 0:
        _, _, header, size = struct.unpack_from("<IHHQ", buf, pos)
        if header != 16 or size == 0 or pos + 16 + size > len(buf):
            pos += 4
            continue
        entry, end = pos + header, pos + header + size
        while entry < end:
            _, _, entry_header, payload = struct.unpack_from("<HHII", buf, entry)
            if not 64 <= entry_header <= 1024 or payload > size:
                break
            yield entry + entry_header, payload, struct.unpack_from("<I", buf, entry + 28)[0]
            entry += entry_header + payload
        pos = end


def keep_only(buf: bytearray, sm: int) -> int:
    """Zero the payload of every entry not built for `sm`; returns the bytes zeroed."""
    zeroed = 0
    for offset, size, version in list(fatbin_entries(buf)):
        if version != sm:
            buf[offset:offset + size] = bytes(size)
            zeroed += size
    return zeroed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--sm", type=int, default=90, help="SM version to keep (90: H100/H200)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(args.wheel) as wheel:
        for name in wheel.namelist():
            if name.startswith("onnxruntime/") and not name.startswith(LEAVE_OUT):
                wheel.extract(name, tmp)
        lib = Path(tmp) / CUDA_PROVIDER
        buf = bytearray(lib.read_bytes())
        print(f"zeroed {keep_only(buf, args.sm) / 1e6:.0f} MB of other architectures' code")
        lib.write_bytes(buf)
        partial = args.out.with_name(args.out.name + ".partial")
        with open(partial, "wb") as f:
            tar = subprocess.Popen(["tar", "cf", "-", "-C", tmp, "onnxruntime"], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-9", "-T0"], stdin=tar.stdout, stdout=f, check=True)
            if tar.wait() != 0:
                raise SystemExit("tar failed")
        os.replace(partial, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
