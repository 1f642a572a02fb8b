#!/usr/bin/env bash
# Makes what an EKS user installs, into one directory:
#
#   gpushare-<version>-1.<arch>.rpm     the node package, signed with KEY (rpmsign)
#   RPM-GPG-KEY-gpushare                KEY's public half, to `rpm --import` on the nodes
#   gpushare-dra-<version>.oci.tar      the plugin's image (OCI archive, made from the RPM's
#                                       own gpushare-dra), named localhost/gpushare-dra:<version>
#   gpushare-dra-<version>.tgz          the Helm chart (helm package)
#   SHA256SUMS, SHA256SUMS.asc          every file's checksum, signed with KEY
#
#   packaging/release.sh --key KEY [--out DIR] [--profile PROFILE | --rpm FILE]
#     --key KEY          a gpg key with its secret half in the keyring ($GNUPGHOME honoured):
#                        its fingerprint, e-mail or name
#     --out DIR          where the artifacts go (default target/dist); must not hold files yet
#     --profile PROFILE  cargo profile the RPM is built with (packaging/build-rpm.sh; default
#                        release; `dev` packages the debug build as it is)
#     --rpm FILE         sign this RPM instead of building one (scripts/test.sh's)
#
# Nothing is written to DIR unless every step succeeded, and the signed RPM is checked with
# `rpm -K` against KEY alone before it is. Prints DIR and KEY's fingerprint at the end.
# docs/install-eks.md says how users check them.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."

die() { echo "release: $*" >&2; exit 1; }
# Paths given relative to where the command was run, not to the repository.
from_here() { case "$1" in /*) echo "$1" ;; *) echo "$here/$1" ;; esac; }
key="" out=target/dist profile=release rpm_in=""
while [ $# -gt 0 ]; do
  case "$1" in
    --key) key=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --profile) profile=${2:-}; shift 2 ;;
    --rpm) rpm_in=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "release: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$key" ] || { echo "release: --key KEY is required (a gpg key to sign with)" >&2; exit 2; }
[ -n "$out" ] || { echo "release: --out needs a directory" >&2; exit 2; }
out=$(from_here "$out")
[ -z "$rpm_in" ] || rpm_in=$(from_here "$rpm_in")
for tool in gpg rpmsign rpm rpm2archive podman sha256sum; do
  command -v "$tool" >/dev/null || die "$tool missing (scripts/install-test-deps.sh installs it)"
done
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  die "$out holds files already: give an empty or new --out directory"
fi
gpg --batch --list-secret-keys "$key" >/dev/null 2>&1 ||
  die "no secret key '$key' in the keyring ${GNUPGHOME:-$HOME/.gnupg} (gpg --list-secret-keys)"
fingerprint=$(gpg --batch --with-colons --list-secret-keys "$key" | awk -F: '$1 == "fpr" { print $10; exit }')
[ "$(gpg --batch --with-colons --list-secret-keys "$key" | grep -c '^sec:')" = 1 ] ||
  die "'$key' names more than one secret key: give its fingerprint"
helm=${HELM:-$(scripts/build-cluster.sh | tail -1)/helm}

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
chart=deployments/helm/gpushare-dra
chart_version=$(sed -n 's/^version: *//p' "$chart/Chart.yaml")
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' "$chart/Chart.yaml")
[ "$chart_version" = "$version" ] && [ "$app_version" = "$version" ] ||
  die "the chart's version ($chart_version) and appVersion ($app_version) must be the workspace's $version"

image=localhost/gpushare-dra:$version
# Beside --out, so that the finished directory is moved there by one rename (a move across
# file systems could be cut off half-way).
parent=$(dirname "$out")
mkdir -p "$parent"
work=$(mktemp -d "$parent/.gpushare-release-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/dist" "$work/root" "$work/rpmdb" "$work/podman"
# podman builds the image in a store of this run's own, gone with it: the user's images are
# left alone, and two releases at once do not share the image's name.
printf '[storage]\ndriver = "vfs"\ngraphroot = "%s"\nrunroot = "%s"\n' \
  "$work/podman/root" "$work/podman/run" >"$work/podman/storage.conf"
export CONTAINERS_STORAGE_CONF="$work/podman/storage.conf"
# rpmsign asks gpg for the key's passphrase through pinentry, which needs the terminal.
if [ -t 0 ] && [ -z "${GPG_TTY:-}" ]; then
  GPG_TTY=$(tty)
  export GPG_TTY
fi

# The RPM, signed. rpm's default %__gpg is gpg2, which Debian does not ship under that name.
if [ -n "$rpm_in" ]; then
  [ -f "$rpm_in" ] || die "--rpm $rpm_in: no such file"
else
  rpm_in=$(packaging/build-rpm.sh --profile "$profile" | tail -1)
fi
rpm_name=$(basename "$rpm_in")
case "$rpm_name" in "gpushare-$version-"*.rpm) ;; *) die "$rpm_name is not gpushare $version's RPM" ;; esac
cp "$rpm_in" "$work/dist/$rpm_name"
rpmsign --define "_gpg_name $fingerprint" --define "__gpg $(command -v gpg)" \
  --addsign "$work/dist/$rpm_name" >&2 2> >(grep -v 'GPG_TTY' >&2) || die "rpmsign failed"
gpg --batch --armor --export "$fingerprint" >"$work/dist/RPM-GPG-KEY-gpushare"
rpm --dbpath "$work/rpmdb" --import "$work/dist/RPM-GPG-KEY-gpushare"
rpm --dbpath "$work/rpmdb" -K "$work/dist/$rpm_name" | grep -q 'digests signatures OK' ||
  die "the signed RPM does not pass rpm -K with the key's public half"

# The plugin's image, from the very binary the RPM ships.
rpm2archive - <"$work/dist/$rpm_name" | tar -xz -C "$work/root"
deployments/build-image.sh "$work/root/usr/bin/gpushare-dra" "$image" >/dev/null
podman save --quiet --format oci-archive -o "$work/dist/gpushare-dra-$version.oci.tar" "$image"

"$helm" package "$chart" --destination "$work/dist" >/dev/null
[ -f "$work/dist/gpushare-dra-$version.tgz" ] || die "helm package made no gpushare-dra-$version.tgz"

(cd "$work/dist" && sha256sum -- * >SHA256SUMS)
gpg --batch --yes --local-user "$fingerprint" --armor --detach-sign \
  --output "$work/dist/SHA256SUMS.asc" "$work/dist/SHA256SUMS"

# An empty --out is replaced by the finished directory.
[ ! -d "$out" ] || rmdir "$out"
mv "$work/dist" "$out"
echo "release: gpushare $version signed by $fingerprint" >&2
echo "$out"
echo "$fingerprint"
