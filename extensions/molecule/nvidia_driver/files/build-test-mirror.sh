#!/bin/sh
# TEST ONLY (raymetal molecule scenario nvidia_driver): builds a signed, flat apt repository at $1 holding
# STAND-IN packages named like the ones the role installs on Debian 12 from NVIDIA's repository.
# They contain no driver, no kernel module and no headers: a text file, and a stand-in
# nvidia-persistenced unit that only sleeps, so that the role's package, hold and service steps have
# something real to act on in a container without a GPU.
set -eu
MIRROR=${1:-/srv/nv-test-mirror}
BUILD=$(mktemp -d)
KERNEL=$(uname -r)
VERSION=570.0.0-0raymetal.test1
mkdir -p "$MIRROR"

stand_in() { # name version [extra setup function]
  name=$1 version=$2
  root=$BUILD/$name
  mkdir -p "$root/DEBIAN" "$root/usr/share/doc/$name"
  cat >"$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: all
Maintainer: raymetal tests <tests@raymetal.invalid>
Section: misc
Priority: optional
Description: TEST STAND-IN for $name (raymetal molecule), not the real package
 Built by extensions/molecule/nvidia_driver/files/build-test-mirror.sh. Contains no driver.
CONTROL
  echo "TEST STAND-IN for $name, built for the raymetal nvidia_driver molecule scenario." \
    >"$root/usr/share/doc/$name/RAYMETAL-TEST-STAND-IN"
  if [ "$name" = nvidia-open-570 ]; then
    mkdir -p "$root/lib/systemd/system"
    cat >"$root/lib/systemd/system/nvidia-persistenced.service" <<UNIT
[Unit]
Description=TEST STAND-IN for nvidia-persistenced (raymetal molecule; no GPU, does nothing)

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
UNIT
  fi
  dpkg-deb --root-owner-group --build "$root" "$MIRROR/${name}_${version}_all.deb" >/dev/null
}

stand_in nvidia-open-570 "$VERSION"
stand_in "linux-headers-$KERNEL" 1.0-0raymetal.test1
stand_in dkms 1.0-0raymetal.test1

cd "$MIRROR"
: >Packages
for deb in *.deb; do
  dpkg-deb -f "$deb" >>Packages
  {
    echo "Filename: ./$deb"
    echo "Size: $(stat -c %s "$deb")"
    echo "SHA256: $(sha256sum "$deb" | cut -d' ' -f1)"
    echo
  } >>Packages
done
{
  echo "Origin: raymetal test mirror"
  echo "Label: TEST STAND-IN NVIDIA mirror"
  echo "Date: $(LC_ALL=C date -u '+%a, %d %b %Y %H:%M:%S UTC')"
  echo "SHA256:"
  echo " $(sha256sum Packages | cut -d' ' -f1) $(stat -c %s Packages) Packages"
} >Release

export GNUPGHOME="$BUILD/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --quiet --passphrase '' --quick-gen-key 'raymetal TEST mirror key (molecule only)' rsa2048 sign 1d
gpg --batch --quiet --armor --export >raymetal-test-mirror-key.asc
gpg --batch --with-colons --show-keys raymetal-test-mirror-key.asc | awk -F: '$1 == "fpr" {print $10; exit}' >FINGERPRINT
gpg --batch --quiet --yes --clearsign --output InRelease Release
rm -rf "$BUILD"
