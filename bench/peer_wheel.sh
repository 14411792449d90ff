#!/usr/bin/env bash
# Fetch the onnxruntime-gpu peer wheel HERE (where pip has network) and cut it into parts that the
# device tool can carry one per call (a call carries at most 64 MiB, the working tree included).
#
#   bash bench/peer_wheel.sh     # ORT_GPU_VERSION=x.y.z and PART_MIB=n override the defaults below
#
# Writes (all ignored through .git/info/exclude, never committed):
#   .peer/dl/onnxruntime_gpu-*.whl      the wheel (Python 3.12, manylinux x86_64); kept out of .whl/,
#                                       which calls carry whole for small wheels (64 MiB a call)
#   .peer/c0/part0 ... .peer/cN/partN   58 MiB parts; each folder also holds wheel.md5
#   .peer/wheel.md5                     "md5  <wheel file name>" for `md5sum -c` on the device
# bench/device_steps.md says how the parts are sent and reassembled.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${ORT_GPU_VERSION:-1.31.1}"
PART_MIB="${PART_MIB:-58}"  # a part + the working tree must fit one call's 64 MiB
PY="${PYTHON:-/tmp/v0/bin/python}"

# Ignore the download folders locally (not in .gitignore: they are this checkout's business only).
mkdir -p .git/info
touch .git/info/exclude
for pat in /.peer/ /.whl/; do
    grep -qxF "$pat" .git/info/exclude || echo "$pat" >>.git/info/exclude
done

mkdir -p .peer/dl
# The device runs Python 3.12 on x86-64; pip matches manylinux tags exactly, so list the usual ones.
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .peer/dl "onnxruntime-gpu==${VERSION}"

shopt -s nullglob
wheels=(.peer/dl/onnxruntime_gpu-"${VERSION}"-cp312-*.whl)
if [ "${#wheels[@]}" -ne 1 ]; then
    echo "expected one onnxruntime_gpu ${VERSION} cp312 wheel in .peer/dl, found: ${wheels[*]:-none}" >&2
    exit 1
fi
wheel="${wheels[0]}"
name="$(basename "$wheel")"

# The CUDA major the wheel was built for shows in the sonames its CUDA provider library needs;
# the device has CUDA 13 (driver 580), so a CUDA 12 build would load no CUDA EP there.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unzip -q -o "$wheel" 'onnxruntime/capi/libonnxruntime_providers_cuda.so' -d "$tmp"
needs="$(grep -a -o -E 'lib(cudart|cublas|cublasLt|cufft|curand)\.so\.[0-9]+' \
    "$tmp/onnxruntime/capi/libonnxruntime_providers_cuda.so" | sort -u | tr '\n' ' ')"
echo "CUDA libraries the CUDA EP links: $needs"
case "$needs" in
*libcudart.so.13* | *libcublas.so.13*) echo "OK: built for CUDA 13" ;;
*)
    echo "onnxruntime-gpu ${VERSION} is not a CUDA 13 build (needs: $needs)" >&2
    exit 1
    ;;
esac

rm -rf .peer/c? .peer/part? .peer/wheel.md5
(cd .peer/dl && md5sum "$name") >.peer/wheel.md5
split -b "${PART_MIB}M" -d -a 1 "$wheel" .peer/part
n=0
for part in .peer/part?; do
    i="${part##*part}"
    mkdir -p ".peer/c$i"
    mv "$part" ".peer/c$i/part$i"
    cp .peer/wheel.md5 ".peer/c$i/wheel.md5"
    n=$((n + 1))
done
echo "wheel: $name ($(stat -c %s "$wheel") bytes), md5 $(cut -d' ' -f1 .peer/wheel.md5)"
echo "parts: $n folders .peer/c0..c$((n - 1)) of at most ${PART_MIB} MiB each:"
ls -l .peer/c*/part?
