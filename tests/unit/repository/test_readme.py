"""The README is a short index; the text that lab tests run as written is where they read it.

The README is also the collection's Galaxy page (galaxy.yml `readme:`), so it stays an index: what
raymetal is, the two commands, a cluster in five steps, and links into docs/. Every link of the
README and of docs/*.md must reach a file (and, for a Markdown target, a heading) that exists.
"""

import configparser
import re
from pathlib import Path

import pytest

from tests.lab import test_collection as lab_collection
from tests.lab import test_workstation_job as lab_workstation_job

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_api_page_embeds_the_api_example_verbatim():
    example = (ROOT / "docs" / "api_example.py").read_text()
    assert "```python\n" + example + "```" in (ROOT / "docs" / "api.md").read_text()


def test_readme_names_the_two_commands():
    readme = README.read_text()
    assert "make demo" in readme and "make test" in readme


def test_readme_is_an_index():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move sections into docs/"
    assert "## Documents" in lines


def test_the_readme_links_every_topic_page():
    linked = set(LINK.findall(README.read_text()))
    pages = {"docs/" + p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages the README does not list"


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_collection_lab_test_finds_the_inventory_lines():
    # tests/lab/test_collection.py writes this section into a collection user's ansible.cfg.
    section = lab_collection.readme_inventory_section()
    assert section == "[inventory]\nignore_patterns = ^(credentials|acceptance)$\n"
    ours = configparser.ConfigParser()
    ours.read(ROOT / "ansible.cfg")
    assert ours["inventory"]["ignore_patterns"] == "^(credentials|acceptance)$"


@pytest.mark.parametrize("tag", ["tunnel", "submit"])
def test_the_workstation_lab_test_finds_its_blocks(tag):
    # tests/lab/test_workstation_job.py runs these blocks as written.
    block = lab_workstation_job.readme_block(tag)
    assert block.strip()
    expected = {"tunnel": "ssh -N", "submit": "ray job submit --address http://127.0.0.1:8265"}[tag]
    assert expected in block
