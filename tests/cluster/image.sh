#!/usr/bin/env bash
# Makes an OCI image archive holding Debian's busybox-static (every applet linked in /bin),
# for `ctr images import`: no registry is reached, no base image pulled.
#
#   tests/cluster/image.sh OUT.tar NAME COMMAND...
#     OUT.tar   the archive (OCI image layout, one layer)
#     NAME      the image's full name, e.g. gpushare.test/busybox:local
#     COMMAND   the image's command, run by /bin/busybox (e.g. `sleep infinity`)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 OUT.tar NAME COMMAND..." >&2; exit 2; }
out=$1 name=$2
shift 2
[ -x /bin/busybox ] || { echo "image.sh: /bin/busybox missing (Debian's busybox-static)" >&2; exit 1; }

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/rootfs/bin" "$dir/rootfs/tmp" "$dir/layout/blobs/sha256"
cp /bin/busybox "$dir/rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || ln -s busybox "$dir/rootfs/bin/$applet"
done
chmod 1777 "$dir/rootfs/tmp"

blob() { # FILE: moves it into the layout as a blob; prints "digest size"
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  mv "$1" "$dir/layout/blobs/sha256/$d"
  echo "sha256:$d $s"
}

tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir/rootfs" -cf "$dir/layer.tar" .
read -r layer layer_size < <(blob "$dir/layer.tar")
cmd=$(printf '%s\n' /bin/busybox "$@" | python3 -c 'import json, sys; print(json.dumps(sys.stdin.read().splitlines()))')
cat >"$dir/config.json" <<EOF
{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Cmd":$cmd,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["$layer"]}}
EOF
read -r config config_size < <(blob "$dir/config.json")
cat >"$dir/manifest.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"$config","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"$layer","size":$layer_size}]}
EOF
read -r manifest manifest_size < <(blob "$dir/manifest.json")
cat >"$dir/layout/index.json" <<EOF
{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"$manifest","size":$manifest_size,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"$name","org.opencontainers.image.ref.name":"${name##*:}"}}]}
EOF
echo '{"imageLayoutVersion":"1.0.0"}' >"$dir/layout/oci-layout"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$dir/layout" -cf "$out" .
