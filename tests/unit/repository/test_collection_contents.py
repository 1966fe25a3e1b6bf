"""What the built collection ships of the docs and changelog tooling (issue 39).

The release history (changelogs/changelog.yaml, with its config) and the docs site's links ship, as collections
ship them; unreleased fragments, antsibull-changelog's plugin cache and the built docs site do not.
"""
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GALAXY = Path(sys.executable).parent / "ansible-galaxy"


def test_collection_ships_the_changelog_and_not_the_fragments_or_the_site(tmp_path):
    subprocess.run([str(GALAXY), "collection", "build", "--output-path", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (tarball,) = tmp_path.glob("raymetal-cluster-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
    for shipped in ("CHANGELOG.md", "changelogs/changelog.yaml", "changelogs/config.yaml", "docs/docsite/links.yml"):
        assert shipped in names, shipped
    leaked = sorted(n for n in names if n.startswith(("changelogs/fragments", "changelogs/.plugin-cache", "build/")))
    assert leaked == [], leaked
