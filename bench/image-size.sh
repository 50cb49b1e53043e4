#!/usr/bin/env bash
# The size of the deploy/Dockerfile image, measured without a container runtime or a registry.
#
#   bench/image-size.sh [BINARY]      default BINARY: target/release/inferwatch (built if missing)
#
# The runtime stage is `gcr.io/distroless/cc-debian12:nonroot` plus three COPY layers (the
# stripped binary, pipeline.yaml, the default ONNX model). Where no registry can be reached, the
# base layer is rebuilt from the Debian 12 packages distroless' cc image is made of (base-files,
# netbase, tzdata, the CA bundle, libc6, libssl3, libgcc-s1, libgomp1, libstdc++6; docs, man
# pages and lintian overrides dropped as distroless drops them, copyright files kept), fetched
# with `apt-get download`. Each layer is measured as a tar (uncompressed, what `docker images`
# shows) and gzip -6 (what a registry stores and a node pulls). Prints a table in MiB.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
BIN=${1:-$ROOT/target/release/inferwatch}
if [[ ! -x $BIN ]]; then
    cargo build --release --bin inferwatch
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

PKGS=(base-files netbase tzdata ca-certificates libc6 libssl3 libgcc-s1 libgomp1 libstdc++6)
mkdir -p "$WORK/debs" "$WORK/base" "$WORK/app/usr/local/bin" "$WORK/app/etc/inferwatch" \
    "$WORK/app/usr/share/inferwatch/models" "$WORK/app/var/lib/inferwatch/state"
(cd "$WORK/debs" && apt-get download "${PKGS[@]}" >/dev/null 2>&1) || {
    echo "apt-get download failed (run 'apt-get update' first?)" >&2
    exit 1
}
for deb in "$WORK"/debs/*.deb; do
    dpkg-deb -x "$deb" "$WORK/base"
done
# What distroless keeps of a package: its files, not its documentation.
find "$WORK/base/usr/share/doc" -type f ! -name copyright -delete 2>/dev/null || true
rm -rf "$WORK/base/usr/share/man" "$WORK/base/usr/share/info" "$WORK/base/usr/share/lintian" \
    "$WORK/base/usr/share/locale"
# The CA bundle ca-certificates' postinst would write.
mkdir -p "$WORK/base/etc/ssl/certs"
find "$WORK/base/usr/share/ca-certificates" -name '*.crt' -exec cat {} + \
    >"$WORK/base/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$WORK/base/etc/passwd"

cp "$BIN" "$WORK/app/usr/local/bin/inferwatch"
strip "$WORK/app/usr/local/bin/inferwatch" 2>/dev/null || true
cp pipeline.yaml "$WORK/app/etc/inferwatch/"
cp models/lstm_ae_default.onnx models/lstm_ae_default.json "$WORK/app/usr/share/inferwatch/models/"

layer() { # dir -> "uncompressed_bytes gzip_bytes"
    local t="$WORK/$(basename "$1").tar"
    tar -C "$1" --sort=name --owner=0 --group=0 --numeric-owner -cf "$t" .
    echo "$(stat -c %s "$t") $(gzip -6 -c "$t" | wc -c)"
}
read -r BU BG < <(layer "$WORK/base")
read -r AU AG < <(layer "$WORK/app")
BINB=$(stat -c %s "$WORK/app/usr/local/bin/inferwatch")
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
printf '%-44s %12s %12s\n' "layer" "tar MiB" "gzip MiB"
printf '%-44s %12s %12s\n' "base (distroless cc-debian12, rebuilt)" "$(mib "$BU")" "$(mib "$BG")"
printf '%-44s %12s %12s\n' "inferwatch (binary $(mib "$BINB") MiB + config + model)" "$(mib "$AU")" "$(mib "$AG")"
printf '%-44s %12s %12s\n' "image" "$(mib $((BU + AU)))" "$(mib $((BG + AG)))"
