#!/usr/bin/env bash
# Copyright (c) Ansible Project
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# Created with antsibull-docs 2.28.0 (sphinx-init --use-current raymetal.cluster).
# raymetal's changes: the site is built into the directory given as $1 (make docs: build/docsite, git-ignored)
# instead of beside this script, and Sphinx turns warnings into errors (-W --keep-going: every warning is
# printed, then the build fails), as antsibull-docs does with --fail-on-error. Offline: the collection is
# read from the configured collections path (ansible.cfg: collections/ansible_collections/raymetal/cluster,
# this repository), and conf.py names no intersphinx inventory to download.

set -euo pipefail

here="$( cd -- "$( dirname -- "${BASH_SOURCE[0]}" )" &> /dev/null && pwd )"
out="$(mkdir -p "${1:?usage: build.sh OUTPUT_DIR}" && cd "$1" && pwd)"

# Create collection documentation
mkdir -p "$out/rst"
chmod og-w "$out/rst"  # antsibull-docs wants that directory only readable by itself
install -m 0644 "$here/rst/index.rst" "$out/rst/index.rst"
antsibull-docs \
    --config-file "$here/antsibull-docs.cfg" \
    collection \
    --cleanup everything \
    --fail-on-error \
    --use-current \
    --dest-dir "$out/rst" \
    raymetal.cluster

# Build Sphinx site
# -E: read every page again; a page left from an earlier build would not repeat its warnings.
sphinx-build -M html "$out/rst" "$out" -c "$here" -E -W --keep-going -q
