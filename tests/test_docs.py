"""Every ```python block of the README and docs/*.md runs as written: one namespace per file of docs/, one per block of
the README (its blocks are self-contained snippets, which a reader copies one at a time)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


README = ROOT / "README.md"


def _run_blocks(path: Path, blocks: list[tuple[int, str]]) -> None:
    namespace = {"__name__": f"doc_{path.stem}"}
    for i, block in blocks:
        try:
            exec(compile(block, f"{path.name}[block {i}]", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            raise AssertionError(f"{path.name} block {i} failed: {exc!r}\n{block}") from exc


@pytest.mark.parametrize("path", [p for p in DOCS if p != README and BLOCK.search(p.read_text())], ids=lambda p: p.name)
def test_python_blocks_run(path):
    _run_blocks(path, list(enumerate(BLOCK.findall(path.read_text()))))


@pytest.mark.parametrize("index", range(len(BLOCK.findall(README.read_text()))), ids=lambda i: f"block{i}")
def test_readme_block_runs_on_its_own(index):
    _run_blocks(README, [(index, BLOCK.findall(README.read_text())[index])])


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


# --- every shell command of the README and docs runs as written (issue 32 item 8) ---------------------------

SHELL = re.compile(r"```(?:bash|sh|shell|console)\n(.*?)```", re.S)
SHARED = ROOT.parent / "shared" / "data"  # the datasets beside the repository (docs name them ../shared/data/…)
#: options that name what a command writes (everything else of type path is read)
OUTPUTS = {"--out", "-o", "--output", "--csv", "--json", "--predictions"}


def _commands():
    """``(doc, argv)`` of every ``maskattn`` command in a shell block (``python -m maskattn.cli`` / ``torchrun -m
    maskattn.cli`` too), with the files shell redirections write."""
    import shlex

    for path in DOCS:
        for block in SHELL.findall(path.read_text()):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                for part in re.split(r"&&|\|", line):
                    words = shlex.split(part, comments=True)
                    if "maskattn" in words:
                        yield path.name, words[words.index("maskattn") + 1:], []
                    elif "maskattn.cli" in words:
                        yield path.name, words[words.index("maskattn.cli") + 1:], []
                    elif ">" in words:
                        yield path.name, None, [words[words.index(">") + 1]]
                    elif words[:1] == ["cp"]:
                        yield path.name, None, [words[-1]]


def _click_command(argv):
    """The click command ``argv`` names and the arguments after its name."""
    import typer

    from maskattn.cli import app

    command = typer.main.get_command(app)
    while argv and hasattr(command, "commands") and argv[0] in command.commands:
        command, argv = command.commands[argv[0]], argv[1:]
    return command, argv


def _paths(command, argv):
    """``(option, value)`` of every path-valued option in ``argv``; unknown options as ``(option, None)``."""
    options = {opt: param for param in command.params if param.param_type_name == "option"
               for opt in (*param.opts, *param.secondary_opts)}
    found, words = [], iter(argv)
    for word in words:
        if not word.startswith("-") or word == "-":
            continue
        name, _, inline = word.partition("=")
        param = options.get(name)
        if param is None:
            found.append((name, None))
        elif not param.is_flag:
            value = inline or next(words, "")
            if param.type_descriptor.annotation is Path:
                found.append((name, value))
    return found


def _produced(name, command, argv, redirected):
    """The files and folders a documented command writes (a run folder: everything under it)."""
    out = [Path(p) for p in redirected]
    if argv is None:
        return out
    written = [Path(value) for option, value in _paths(command, argv) if option in OUTPUTS and value]
    if command.name == "train" and not written:
        preset = argv[argv.index("--preset") + 1] if "--preset" in argv else None
        written = [Path("runs") / (preset or "default")]
    return out + written


def test_every_documented_command_names_options_that_exist_and_files_that_do():
    """Every option of a documented ``maskattn`` command exists, and every file or folder it reads exists: in the
    repository, in the shared data (when it is there) or as what another documented command writes (README named
    ``-i src.en``, ``--src test.en`` and ``runs/dman/…``, which nothing wrote)."""
    commands = [(doc, *_click_command(argv), redirected) if argv is not None else (doc, None, None, redirected)
                for doc, argv, redirected in _commands()]
    assert len(commands) > 50
    produced = {p for doc, command, argv, redirected in commands
                for p in _produced(doc, command, argv, redirected)}
    problems = []
    for doc, command, argv, _ in commands:
        if argv is None:
            continue
        for option, value in _paths(command, argv):
            if value is None:
                problems.append(f"{doc}: maskattn {command.name}: no option {option}")
            elif option in OUTPUTS or "$" in value or value == "-":
                continue
            else:
                path = Path(value)
                if path.parts[:3] == ("..", "shared", "data"):
                    if SHARED.is_dir() and not (SHARED / Path(*path.parts[3:])).exists():
                        problems.append(f"{doc}: maskattn {command.name} {option} {value}: not in the shared data")
                elif not (ROOT / path).exists() and not any(p == path or p in path.parents for p in produced):
                    problems.append(f"{doc}: maskattn {command.name} {option} {value}: no such file, and no "
                                    "documented command writes it")
    assert not problems, "\n".join(problems)
