#!/usr/bin/env bash
# `ansible-test sanity` on the collection as Galaxy gets it: built with
# ansible-galaxy, installed into a temporary ansible_collections tree, tested
# there (make lint runs it). Extra arguments go to ansible-test, e.g.
#   tools/sanity.sh --test validate-modules
#
# Offline apart from the Python index: ansible-test makes a venv without pip
# for each test and bootstraps pip into it with a get-pip.py it downloads from
# ci-files.testing.ansible.com, unless ~/.ansible/test/cache/get_pip_<ver>.py
# exists. That home is .cache/ansible-test here (its venvs and caches too),
# where this script puts tools/get_pip.py beside the pinned pip wheel (by
# hash, from the Python index with pip). The tests' own pinned requirements
# come from the Python index through pip, once; later runs reuse the venvs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${BIN:-$root/.venv/bin}
# The pip that ansible-test 2.19 bootstraps (ansible_test/_internal/python_requirements.py).
pip_version=24.2
pip_sha256=2cd581cf58ab7fcfca4ce8efa6dcacd0de5bf8d0a3eb9ec927e07405f4d9e2a2
home=$root/.cache/ansible-test
cache=$home/.ansible/test/cache
wheel=$cache/pip-$pip_version-py3-none-any.whl

mkdir -p "$cache"
if ! echo "$pip_sha256  $wheel" | sha256sum --check --status 2>/dev/null; then
  req=$(mktemp)
  echo "pip==$pip_version --hash=sha256:$pip_sha256" > "$req"
  "$bin/pip" download -q --disable-pip-version-check --no-deps --only-binary :all: --require-hashes \
    -r "$req" -d "$cache"
  rm -f "$req"
fi
install -m 0644 "$root/tools/get_pip.py" "$cache/get_pip_${pip_version//./_}.py"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin/ansible-galaxy" collection build --output-path "$work" "$root" >/dev/null
# --force: the configured collections path (ansible.cfg) already holds raymetal.cluster (this checkout).
"$bin/ansible-galaxy" collection install --force --no-deps -p "$work/collections" "$work"/raymetal-cluster-*.tar.gz >/dev/null
cd "$work/collections/ansible_collections/raymetal/cluster"
# ansible-test sets up its own environment; the repository's ansible.cfg would point it at the checkout.
# Python 3.11 by default: the controller's and Debian 12 nodes' (the only one our machines have;
# tests/config.yml gives the nodes' whole range). SANITY_PYTHON=3.13 tests another one that is installed.
env -u ANSIBLE_CONFIG HOME="$home" PATH="$bin:$PATH" "$bin/ansible-test" sanity --color no \
  --python "${SANITY_PYTHON:-3.11}" "$@"
