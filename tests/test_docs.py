"""Every ```python block of the README and docs/*.md runs as written (one namespace per file)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("path", [p for p in DOCS if BLOCK.search(p.read_text())], ids=lambda p: p.name)
def test_python_blocks_run(path):
    namespace = {"__name__": f"doc_{path.stem}"}
    for i, block in enumerate(BLOCK.findall(path.read_text())):
        try:
            exec(compile(block, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name} block {i} failed: {exc!r}\n{block}") from exc


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = "pip install -e '.[dev]' && python -m pytest -q"
    assert test_command in readme and test_command in ci
    assert "pip install -e . && maskattn train" in readme


def test_cli_lists_mechanisms():
    from typer.testing import CliRunner

    from maskattn.cli import app

    result = CliRunner().invoke(app, ["list"])
    assert result.exit_code == 0
    for name in ("mtsa", "fast_disa", "disa", "mha"):
        assert name in result.output


def test_demo_runs_quickly(capsys):
    from maskattn.demo import run_demo

    results = run_demo(steps=5)
    assert set(results) == {"mtsa", "mha"}
    out = capsys.readouterr().out
    assert "sdpa" in out and "finite" in out
