"""What a non-editable `pip install .` ships: pyproject.toml lists every package folder of distill/ and
eval/ (installed as distill.eval), and the model card template as package data."""

from __future__ import annotations

import fnmatch
from importlib import resources
from pathlib import Path

import pytest

from distill.commands import publish

REPO = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed():
    """A folder holding Python modules or package data that pyproject.toml leaves out would be missing after `pip install .`."""
    listed = set(_setuptools()["packages"])
    found = set()
    for top, name in (("distill", "distill"), ("eval", "distill.eval")):
        for folder in [REPO / top, *(p for p in (REPO / top).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            if any(f.suffix in (".py", ".md") for f in folder.iterdir()):
                found.add(".".join([name, *folder.relative_to(REPO / top).parts]))
    assert found == listed


def test_the_card_template_is_package_data():
    packaged = resources.files("distill.commands.templates") / "model_card.md"
    assert packaged.is_file() and Path(str(publish.MODEL_CARD_TEMPLATE)) == Path(str(packaged))
    globs = _setuptools()["package-data"]["distill.commands.templates"]
    assert any(fnmatch.fnmatch("model_card.md", g) for g in globs)
