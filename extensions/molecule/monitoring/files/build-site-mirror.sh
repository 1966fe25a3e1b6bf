#!/bin/sh
# TEST ONLY (raymetal molecule scenario monitoring). Builds the scenario's site
# mirror at $2 from the lab's apt mirror at $1: every .deb of the lab's mirror
# (linked, unchanged, with the lab's own Packages entries) plus TEST STAND-IN
# packages named like the ones the monitoring role installs from outside
# Debian: NVIDIA's DCGM 4 and dcgm-exporter, and Grafana. The stand-ins contain
# no DCGM and no Grafana: a unit each and a small Python server that answers on
# the address the role configures, so that the role's install, drop-in,
# provisioning, service and scrape steps act on something real without a GPU.
set -eu
LAB=${1:-/srv/mirror}
SITE=${2:-/srv/site}
BUILD=$(mktemp -d)
VERSION=0.0.1-0raymetal.test1
mkdir -p "$SITE"

stand_in() { # name
  name=$1
  root=$BUILD/$name
  mkdir -p "$root/DEBIAN" "$root/usr/share/doc/$name" "$root/lib/systemd/system" "$root/usr/bin"
  cat >"$root/DEBIAN/control" <<CONTROL
Package: $name
Version: $VERSION
Architecture: all
Maintainer: raymetal tests <tests@raymetal.invalid>
Depends: python3
Section: misc
Priority: optional
Description: TEST STAND-IN for $name (raymetal molecule), not the real package
 Built by extensions/molecule/monitoring/files/build-site-mirror.sh. Contains no $name.
CONTROL
  echo "TEST STAND-IN for $name, built for the raymetal monitoring molecule scenario." \
    >"$root/usr/share/doc/$name/RAYMETAL-TEST-STAND-IN"
}

unit() { # package unit ExecStart [Environment]
  cat >"$BUILD/$1/lib/systemd/system/$2" <<UNIT
[Unit]
Description=TEST STAND-IN for $2 (raymetal molecule; does nothing real)

[Service]
ExecStart=$3

[Install]
WantedBy=multi-user.target
UNIT
}

# dcgm-exporter stand-in: serves fixed DCGM series on --address (as the real
# one's flag), after checking that the collectors file it is given exists.
server() { # path of the script; first argument form
  cat >"$1" <<'PY'
#!/usr/bin/python3
"""TEST STAND-IN (raymetal molecule): answers HTTP like the real daemon's health/metrics endpoints."""
import http.server, os, sys

def arg(flag, default=""):
    return sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default

if os.path.basename(sys.argv[0]) == "dcgm-exporter":
    host, _, port = arg("--address", ":9400").rpartition(":")
    collectors = arg("--collectors")
    open(collectors).close()
    body = ("# TEST STAND-IN series\nDCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-STANDIN\"} 0\n"
            "DCGM_FI_DEV_XID_ERRORS{gpu=\"0\",UUID=\"GPU-STANDIN\"} 0\n")
else:
    host, port = os.environ["GF_SERVER_HTTP_ADDR"], os.environ.get("GF_SERVER_HTTP_PORT", "3000")
    body = '{"database": "ok", "version": "TEST STAND-IN"}'

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

http.server.HTTPServer((host.strip("[]"), int(port)), Handler).serve_forever()
PY
  chmod 0755 "$1"
}

stand_in datacenter-gpu-manager-4-cuda12
unit datacenter-gpu-manager-4-cuda12 nvidia-dcgm.service "/bin/sleep infinity"

stand_in datacenter-gpu-manager-exporter
server "$BUILD/datacenter-gpu-manager-exporter/usr/bin/dcgm-exporter"
mkdir -p "$BUILD/datacenter-gpu-manager-exporter/etc/dcgm-exporter"
unit datacenter-gpu-manager-exporter nvidia-dcgm-exporter.service \
  "/usr/bin/dcgm-exporter -f /etc/dcgm-exporter/default-counters.csv"

stand_in grafana
server "$BUILD/grafana/usr/bin/grafana-server-standin"
mkdir -p "$BUILD/grafana/etc/grafana/provisioning" "$BUILD/grafana/usr/sbin"
unit grafana grafana-server.service "/usr/bin/grafana-server-standin"
# As the real package: a grafana system user and group (the role's password
# file is root:grafana), and grafana-cli, whose reset-admin-password the role
# runs; the stand-in keeps the password it is given where verify can read it.
cat >"$BUILD/grafana/DEBIAN/postinst" <<'SH'
#!/bin/sh
set -e
getent group grafana >/dev/null || groupadd --system grafana
getent passwd grafana >/dev/null || useradd --system --gid grafana --home-dir /usr/share/grafana --shell /usr/sbin/nologin grafana
SH
chmod 0755 "$BUILD/grafana/DEBIAN/postinst"
cat >"$BUILD/grafana/usr/sbin/grafana-cli" <<'SH'
#!/bin/sh
# TEST STAND-IN (raymetal molecule): grafana-cli admin reset-admin-password --password-from-stdin
set -eu
[ "$*" = "admin reset-admin-password --password-from-stdin" ] || { echo "stand-in: unexpected arguments: $*" >&2; exit 2; }
mkdir -p /var/lib/grafana
umask 077
cat >/var/lib/grafana/standin-admin-password
SH
chmod 0755 "$BUILD/grafana/usr/sbin/grafana-cli"

# The lab's packages, unchanged, and their index entries; then the stand-ins'.
rm -f "$SITE"/*.deb
for deb in "$LAB"/*.deb; do ln -sf "$deb" "$SITE/"; done
cp "$LAB/Packages" "$SITE/Packages.new"
for name in datacenter-gpu-manager-4-cuda12 datacenter-gpu-manager-exporter grafana; do
  deb="${name}_${VERSION}_all.deb"
  dpkg-deb --root-owner-group --build "$BUILD/$name" "$SITE/$deb" >/dev/null
  {
    echo
    dpkg-deb -f "$SITE/$deb"
    echo "Filename: ./$deb"
    echo "Size: $(stat -c %s "$SITE/$deb")"
    echo "SHA256: $(sha256sum "$SITE/$deb" | cut -d' ' -f1)"
  } >>"$SITE/Packages.new"
done
# One blank line between entries; apt reads Packages.gz first when present.
awk 'NF {print; blank = 0; next} !blank {print; blank = 1}' "$SITE/Packages.new" >"$SITE/Packages"
rm -f "$SITE/Packages.new" "$SITE/Packages.gz"
gzip -9kn "$SITE/Packages"
rm -rf "$BUILD"
