"""The README shows the API example exactly as the lab test runs it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_embeds_the_api_example_verbatim():
    example = (ROOT / "docs" / "api_example.py").read_text()
    assert "```python\n" + example + "```" in (ROOT / "README.md").read_text()


def test_readme_names_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
