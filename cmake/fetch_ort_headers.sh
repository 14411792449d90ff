#!/bin/sh
# Fetch ONNX Runtime's C headers (plugin-EP ABI) without installing anything.
#
# No PyPI wheel ships ORT's C headers, so we download Debian's `libonnxruntime-dev` (suite sid carries
# 1.23.2, ORT_API_VERSION 23) with apt-get into a private apt state directory and unpack it with
# `dpkg -x`. Nothing is installed system-wide, no root is needed, no other package is pulled.
#
# usage: fetch_ort_headers.sh WORKDIR
# prints the include directory (the one holding onnxruntime_c_api.h) on success.
# Re-running with the same WORKDIR reuses the unpacked headers (no network).
# Env: MIGRAPHX_EP_DEBIAN_MIRROR overrides the mirror URI (default: the machine's configured
# Debian mirror, else http://deb.debian.org/debian).
set -eu

D=${1:?usage: fetch_ort_headers.sh WORKDIR}
INC="$D/x/usr/include/onnxruntime"
if [ -f "$INC/onnxruntime_ep_c_api.h" ]; then
    echo "$INC"
    exit 0
fi

for tool in apt-get dpkg; do
    command -v "$tool" >/dev/null 2>&1 || { echo "fetch_ort_headers: '$tool' not found (not a Debian-like system)" >&2; exit 1; }
done

# Reuse the machine's Debian mirror when one is configured (deb822 'URIs:' or one-line 'deb URI'),
# skipping the security archive which has no sid suite.
mirror=${MIGRAPHX_EP_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
    mirror=$( (cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p';
               cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
                   sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p') |
             tr ' ' '\n' | grep -v security | grep '/debian/\?$' | head -n 1) || true
fi
mirror=${mirror:-http://deb.debian.org/debian}

keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { echo "fetch_ort_headers: $keyring missing (install debian-archive-keyring)" >&2; exit 1; }

mkdir -p "$D/parts" "$D/lists/partial" "$D/cache/archives/partial" "$D/dl"
cat > "$D/parts/sid.sources" <<EOF
Types: deb
URIs: $mirror
Suites: sid
Components: main
Signed-By: $keyring
EOF

# A private apt configuration: our own source list, package lists and cache; no lock on the system's.
O="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$D/parts -o Dir::State::Lists=$D/lists"
O="$O -o Dir::Cache=$D/cache -o Debug::NoLocking=1 -o APT::Sandbox::User=$(id -un)"

# shellcheck disable=SC2086  # $O is a list of options on purpose
apt-get -q $O update >&2
# shellcheck disable=SC2086
(cd "$D/dl" && apt-get -q $O download libonnxruntime-dev >&2)
deb=$(ls "$D"/dl/libonnxruntime-dev_*.deb | head -n 1)
dpkg -x "$deb" "$D/x"
[ -f "$INC/onnxruntime_ep_c_api.h" ] || { echo "fetch_ort_headers: $deb has no onnxruntime_ep_c_api.h" >&2; exit 1; }
echo "$INC"
