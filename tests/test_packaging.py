"""The release checks: one version everywhere, a docstring for every public name, and the wheel check's verdict
(scripts/check_wheel.py, which .ci/run runs on the real wheel through scripts/check_wheel.sh)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import maskattn
from maskattn.cli import app

ROOT = Path(__file__).resolve().parents[1]
#: the packages whose ``__all__`` is the public API (the API reference documents them: mkdocs.yml)
PUBLIC = ["maskattn", "maskattn.masks", "maskattn.functional", "maskattn.attention", "maskattn.backends",
          "maskattn.layers", "maskattn.models", "maskattn.hf", "maskattn.data", "maskattn.metrics", "maskattn.analysis",
          "maskattn.inference", "maskattn.train", "maskattn.grid", "maskattn.bench", "maskattn.viz", "maskattn.errors",
          "maskattn.sections", "maskattn.device", "maskattn.checkpoint"]


def test_one_version_everywhere():
    version = metadata.version("maskattn")
    assert maskattn.__version__ == version
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"maskattn {version}"
    assert f"version = \"{version}\"" in (ROOT / "pyproject.toml").read_text()


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_name_has_a_docstring(module):
    mod = importlib.import_module(module)
    assert mod.__doc__, module
    missing = []
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not obj.__doc__:
            missing.append(name)
    assert not missing, f"{module}: public names without a docstring: {missing}"


def test_every_public_package_has_an_api_page():
    config = (ROOT / "mkdocs.yml").read_text()
    for module in PUBLIC:
        slug = "index" if module == "maskattn" else module.split(".")[-1]
        page = ROOT / "docs" / "api" / f"{slug}.md"
        assert page.is_file() and f"::: {module}\n" in page.read_text(), module
        assert f"api/{slug}.md" in config, module


def _check_wheel():
    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "scripts" / "check_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_wheel_check_names_a_missing_resource(tmp_path, capsys):
    check = _check_wheel()
    files = sorted(check.package_files())
    assert "maskattn/configs/trec.yaml" in files and "maskattn/cli/__init__.py" in files
    complete, partial = tmp_path / "complete.whl", tmp_path / "partial.whl"
    for path, names in ((complete, files), (partial, [f for f in files if f != "maskattn/configs/trec.yaml"])):
        with zipfile.ZipFile(path, "w") as wheel:
            for name in names:
                wheel.writestr(name, "")
    assert check.main([str(complete)]) == 0
    assert check.main([str(partial)]) == 1
    assert "lacks 1 file(s) of src/maskattn: maskattn/configs/trec.yaml" in capsys.readouterr().err
