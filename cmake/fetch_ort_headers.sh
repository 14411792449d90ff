#!/bin/sh
# Fetch ONNX Runtime's C headers (plugin-EP ABI) without installing anything.
#
# No PyPI wheel ships ORT's C headers, so we download Debian's `libonnxruntime-dev` with apt-get into a
# private apt state directory and unpack it with `dpkg -x`. Nothing is installed system-wide, no root
# is needed, no other package is pulled.
#
# Which release: suite experimental carries 1.27.1 (ORT_API_VERSION 27), which lets the plugin declare
# IsConcurrentRunSupported (1.24) and Sync (1.25) to runtimes that have them. Only if experimental has
# no libonnxruntime-dev do we fall back to sid's 1.23.2 (API 23: those callbacks are then left out),
# and say so on stderr.
#
# usage: fetch_ort_headers.sh WORKDIR
# prints the include directory (the one holding onnxruntime_c_api.h) on success.
# Re-running with the same WORKDIR reuses the unpacked headers (no network); `WORKDIR/x/.suite` records
# where they came from ("experimental 1.27.1+dfsg-1"). Headers unpacked by an older version of this
# script (no .suite) are fetched again. Delete WORKDIR to fetch again after a fallback.
# Env: MIGRAPHX_EP_DEBIAN_MIRROR overrides the mirror URI (default: the machine's configured
# Debian mirror, else http://deb.debian.org/debian).
set -eu

D=${1:?usage: fetch_ort_headers.sh WORKDIR}
INC="$D/x/usr/include/onnxruntime"
if [ -f "$INC/onnxruntime_ep_c_api.h" ] && [ -f "$D/x/.suite" ]; then
    echo "$INC"
    exit 0
fi

for tool in apt-get apt-cache dpkg; do
    command -v "$tool" >/dev/null 2>&1 || { echo "fetch_ort_headers: '$tool' not found (not a Debian-like system)" >&2; exit 1; }
done

# Reuse the machine's Debian mirror when one is configured (deb822 'URIs:' or one-line 'deb URI'),
# skipping the security archive which has neither suite.
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

rm -rf "$D/parts" "$D/dl" "$D/x"
mkdir -p "$D/parts" "$D/lists/partial" "$D/cache/archives/partial" "$D/dl"

# A private apt configuration: our own source list, package lists, cache and (empty) dpkg status; no
# lock on the system's.
O="-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts=$D/parts -o Dir::State::Lists=$D/lists"
O="$O -o Dir::State::status=/dev/null -o Dir::Cache=$D/cache -o Debug::NoLocking=1"
O="$O -o APT::Sandbox::User=$(id -un)"

# Point the private state at one suite, refresh its package list, and print the version of
# libonnxruntime-dev it carries (empty when it has none).
use_suite() {
    rm -f "$D"/parts/*.sources
    cat > "$D/parts/$1.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $1
Components: main
Signed-By: $keyring
EOF
    # shellcheck disable=SC2086  # $O is a list of options on purpose
    apt-get -q $O update >&2
    # madison lists "pkg | version | source"; with one suite configured, any row is that suite's.
    # shellcheck disable=SC2086
    apt-cache $O madison libonnxruntime-dev 2>/dev/null | sed -n 's/^[^|]*|[[:space:]]*\([^[:space:]|]*\).*/\1/p' |
        head -n 1
}

suite=experimental
version=$(use_suite "$suite")
if [ -z "$version" ]; then
    echo "fetch_ort_headers: suite experimental has no libonnxruntime-dev; falling back to sid's" \
         "(older plugin ABI: the build then leaves out the API 24+ callbacks)" >&2
    suite=sid
    version=$(use_suite "$suite")
    [ -n "$version" ] || { echo "fetch_ort_headers: neither experimental nor sid carries libonnxruntime-dev at $mirror" >&2; exit 1; }
fi

# shellcheck disable=SC2086
(cd "$D/dl" && apt-get -q $O download "libonnxruntime-dev=$version" >&2)
deb=$(ls "$D"/dl/libonnxruntime-dev_*.deb | head -n 1)
dpkg -x "$deb" "$D/x"
[ -f "$INC/onnxruntime_ep_c_api.h" ] || { echo "fetch_ort_headers: $deb has no onnxruntime_ep_c_api.h" >&2; exit 1; }
echo "$suite $version" > "$D/x/.suite"
echo "fetch_ort_headers: ONNX Runtime headers $version from suite $suite" >&2
echo "$INC"
