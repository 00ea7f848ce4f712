"""A grid of runs — settings × seeds — as one resumable job (``maskattn grid run``).

A grid is a base configuration (a preset or a YAML file) and ``section.key=value`` overrides, where a value may
list several values in Hydra's multirun spelling: ``model.encoder=mtsa,mha`` (values split at commas outside
brackets and quotes: ``'csan2d x3, mha x3'`` is one value), ``optim.lr=range(1,4)`` (Hydra's ``range(start, stop[,
step])``). Named variants bundle several settings into one row (``mha={model.encoder: mha, model.positional:
sinusoidal}``; or a file of them, ``--variants``), and seeds (``0-4``, ``0,2``) repeat every cell. The runs are the
product variants × swept values × seeds (× ``data.fold`` values, the other replicate axis).

Every run has its own folder, ``<grid>/<cell>/seed<k>`` (``-fold<f>`` when folds are swept), and is run to its end
by :func:`maskattn.train.resumable.run_to_end` in a process of its own (``python -m maskattn.cli.grid_worker``), ``jobs``
at a time with ``threads`` intra-op threads each: a finished run (its ``summary.json``) is not run again, an
interrupted one resumes from its ``last.safetensors``. ``<grid>/grid.json`` is the grid's manifest — the base, the
fixed overrides, the working directory and every run with its overrides —, so ``maskattn grid run --out <grid>``
alone continues a grid, and the same command with more seeds or values adds runs to it. Several grid processes may
share one grid folder: each run is held by the process that trains it (``<run>/.grid-worker``, a ``flock``), and a
run another process holds is left to it.

Before any run starts every run's configuration is built and checked (an unknown key, a value of the wrong type or
range, a model that cannot be built, a missing data folder or vectors file): one mistake refuses the whole grid.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..errors import ConfigError, MaskattnError
from ..data.text import read_text
from .config import RunConfig, load_config, preset_path
from .resumable import read_summary, write_json

__all__ = ["GridRun", "Grid", "define_grid", "load_grid", "run_grid", "run_one", "split_values", "parse_seeds",
           "MANIFEST", "REPLICATE_KEYS", "BUSY_EXIT", "WORKER"]

MANIFEST = "grid.json"
FORMAT = "maskattn-grid/1"
#: keys whose values repeat a cell rather than define one (a table averages over them)
REPLICATE_KEYS = ("train.seed", "data.fold")
#: a worker's exit status when another process holds its run
BUSY_EXIT = 75
#: the module a run's process executes: ``python -m <WORKER> GRID RUN THREADS`` (:func:`run_one`)
WORKER = "maskattn.cli.grid_worker"
_WORKER_LOCK = ".grid-worker"
_RANGE = re.compile(r"^range\((.*)\)$")


def split_values(text: str) -> list[str]:
    """The values of one override's value text, in Hydra's multirun spelling (module docstring): the pieces between
    commas outside brackets, braces, parentheses and quotes, or the numbers of ``range(start, stop[, step])``."""
    if match := _RANGE.match(text.strip()):
        return _range_values(match.group(1), text)
    pieces: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    pieces.append("".join(current).strip())
    if quote or depth:
        raise ConfigError(f"value {text!r}: unbalanced {'quote' if quote else 'brackets'}")
    if len(pieces) > 1 and not all(pieces):
        raise ConfigError(f"value {text!r}: an empty value between commas; quote a value that holds a comma "
                          "(e.g. model.encoder='csan2d x3, mha x3')")
    return pieces


def _range_values(arguments: str, text: str) -> list[str]:
    try:
        numbers = [yaml.safe_load(a) for a in arguments.split(",")]
    except yaml.YAMLError:
        numbers = []
    if not 2 <= len(numbers) <= 3 or not all(isinstance(n, (int, float)) and not isinstance(n, bool) for n in numbers):
        raise ConfigError(f"value {text!r}: expected range(start, stop) or range(start, stop, step) with numbers")
    start, stop, step = (numbers + [1])[:3]
    if step == 0:
        raise ConfigError(f"value {text!r}: the step of a range cannot be 0")
    values, value = [], start
    while (value < stop) if step > 0 else (value > stop):
        values.append(value)
        value = start + len(values) * step  # no accumulated rounding for float steps
    if not values:
        raise ConfigError(f"value {text!r}: the range is empty")
    return [str(v) for v in values]


def parse_seeds(text: str) -> list[int]:
    """``0-4``, ``0,2,5``, ``range(0,5)`` or a mix of the first two (``0-2,7``) → the seeds, in order, once each."""
    seeds: list[int] = []
    for piece in split_values(text) if "range(" in text else [p.strip() for p in text.split(",")]:
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
        if not match or (match.group(2) is not None and int(match.group(2)) < int(match.group(1))):
            raise ConfigError(f"--seeds {text!r}: expected seeds such as 0-4 or 0,1,2 (non-negative ints, ranges "
                              "low-high)")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        seeds += [s for s in range(low, high + 1) if s not in seeds]
    return seeds


@dataclass
class GridRun:
    """One run of a grid: its folder (relative to the grid's), its cell (the folder of its row), the settings that
    make the cell (``key → value text``; a variant's name under ``variant``), its replicate values and its
    overrides (on top of the grid's fixed ones)."""

    name: str
    cell: str
    settings: dict[str, str]
    replicate: dict[str, str]
    overrides: list[str]

    def to_dict(self) -> dict:
        return {"name": self.name, "cell": self.cell, "settings": self.settings, "replicate": self.replicate,
                "overrides": self.overrides}


@dataclass
class Grid:
    """A grid's manifest (module docstring): ``base`` (``{"preset": name}``, ``{"config": path}`` or ``{}``), the
    ``fixed`` overrides of every run, the working directory the runs' relative paths mean, and the runs."""

    folder: Path
    base: dict
    fixed: list[str]
    cwd: str
    runs: list[GridRun] = field(default_factory=list)

    def base_path(self) -> Path | None:
        if "preset" in self.base:
            return preset_path(self.base["preset"])
        return Path(self.base["config"]) if "config" in self.base else None

    def config(self, run: GridRun, extra: Sequence[str] = ()) -> RunConfig:
        """The run's full configuration: base ← fixed overrides ← the run's ← its folder ← ``extra``."""
        overrides = [*self.fixed, *run.overrides, f"train.out_dir={self.folder / run.name}", "train.progress=false",
                     *extra]
        return load_config(self.base_path(), overrides)

    def save(self) -> None:
        write_json(self.folder / MANIFEST, {"format": FORMAT, "base": self.base, "fixed": self.fixed, "cwd": self.cwd,
                                            "runs": [run.to_dict() for run in self.runs]})


def load_grid(folder: str | Path) -> Grid:
    """The grid in ``folder`` (its ``grid.json``); a folder without one raises :class:`ConfigError`."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{folder} holds no grid ({MANIFEST} not found); start one with maskattn grid run --out "
                          f"{folder} and its settings")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        runs = [GridRun(**run) for run in data["runs"]]
        return Grid(folder, data["base"], list(data["fixed"]), data["cwd"], runs)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path} is not a maskattn grid manifest ({exc})") from None


def _short_names(keys: Sequence[str]) -> dict[str, str]:
    """Each key by its last part (``model.encoder`` → ``encoder``) unless two keys share it."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: (short if last.count(short) == 1 else key) for key, short in zip(keys, last)}


def _unquoted(value: str) -> str:
    """A value as a name shows it: without the quotes that kept its commas together."""
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=+,-]+", "_", text).strip("_")[:80] or "_"


def _parse_override(item: str) -> tuple[str, str]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must be written section.key=value, e.g. optim.lr=0.5")
    key, value = item.split("=", 1)
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", key.strip()):
        raise ConfigError(f"override {item!r}: {key.strip()!r} is not a section.key name")
    return key.strip(), value


def _variant_settings(name: str, settings, where: str) -> tuple[str, list[str]]:
    """(name, overrides) of a variant whose settings are a mapping ``{section.key: value, ...}``."""
    if not re.fullmatch(r"[A-Za-z0-9._+-]+", name):
        raise ConfigError(f"{where}: a variant's name is made of letters, digits, '.', '_', '+', '-'; got {name!r}")
    if not isinstance(settings, dict) or not all(isinstance(k, str) for k in settings):
        raise ConfigError(f"{where}: expected the settings of variant {name!r} as a mapping {{section.key: value, ...}}")
    overrides = [f"{key}={json.dumps(value)}" for key, value in settings.items()]
    for override in overrides:
        _parse_override(override)
    return name, overrides


def _parse_variants(items: Sequence[str], path: str | Path | None) -> list[tuple[str, list[str]]]:
    """``--variant`` items — ``NAME={section.key: value, ...}``, or ``NAME`` alone for a variant of the
    ``--variants`` file — and that file (a YAML mapping of names to settings; all of it when no ``NAME`` is given)."""
    known: dict = {}
    if path is not None:
        try:
            known = yaml.safe_load(read_text(path, "variants file")) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"variants file {path}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
        if not isinstance(known, dict):
            raise ConfigError(f"variants file {path} must hold a mapping of variant names to settings")
    variants = []
    for item in items:
        name, equals, mapping = item.partition("=")
        if equals:
            try:
                settings = yaml.safe_load(mapping) if mapping.strip() else {}
            except yaml.YAMLError as exc:
                raise ConfigError(f"variant {item!r}: the settings are not valid YAML "
                                  f"({getattr(exc, 'problem', None) or exc})") from None
            variants.append(_variant_settings(name.strip(), settings, f"variant {item!r}"))
        elif name.strip() in known:
            variants.append(_variant_settings(name.strip(), known[name.strip()], f"variants file {path}"))
        else:
            raise ConfigError(f"variant {item!r}: expected NAME={{section.key: value, ...}}"
                              + (f", or one of the variants of {path}: {', '.join(map(str, known))}" if path else
                                 ", or a NAME defined in a --variants file"))
    if not items:
        variants = [_variant_settings(str(name), settings, f"variants file {path}") for name, settings in known.items()]
    names = [name for name, _ in variants]
    if len(set(names)) != len(names):
        raise ConfigError(f"two variants share a name: {names}")
    return variants


def define_grid(folder: str | Path, *, preset: str | None = None, config: str | Path | None = None,
                overrides: Sequence[str] = (), variants: Sequence[str] = (), variants_file: str | Path | None = None,
                seeds: str | None = None, cwd: str | Path | None = None) -> Grid:
    """The grid of these settings in ``folder`` (module docstring), with every run's configuration checked
    (:func:`check_runs`). ``variants``: ``NAME={section.key: value, ...}``, or ``NAME`` of a variant of
    ``variants_file`` (a YAML mapping of names to settings; all of them when ``variants`` is empty). An existing grid
    in ``folder`` gains the runs it lacks; one with another base or other fixed overrides is refused."""
    if preset and config:
        raise ConfigError("give either --config or --preset, not both")
    folder = Path(folder)
    base = {"preset": preset} if preset else {"config": str(Path(config).resolve())} if config else {}
    fixed: list[str] = []
    swept: list[tuple[str, list[str]]] = []
    for item in overrides:
        key, value = _parse_override(item)
        if key == "train.out_dir":
            raise ConfigError(f"override {item!r}: each run of a grid has its own folder inside the grid's (--out)")
        values = split_values(value)
        if len(values) > 1:
            if any(k == key for k, _ in swept):
                raise ConfigError(f"{key} is swept twice; give its values once, e.g. {key}=a,b,c")
            swept.append((key, values))
        else:
            fixed.append(f"{key}={values[0]}")
    if seeds is not None:
        if any(k == "train.seed" for k, _ in swept) or any(f.startswith("train.seed=") for f in fixed):
            raise ConfigError("give the seeds either with --seeds or with --set train.seed=..., not both")
        swept.append(("train.seed", [str(s) for s in parse_seeds(seeds)]))
    named = _parse_variants(variants, variants_file)
    grid = Grid(folder, base, fixed, str(Path(cwd or os.getcwd()).resolve()), _runs(swept, named))
    check_runs(grid)
    if (folder / MANIFEST).is_file():
        grid = _merged(load_grid(folder), grid)
    return grid


def _runs(swept: list[tuple[str, list[str]]], variants: list[tuple[str, list[str]]]) -> list[GridRun]:
    """The product variants × cell values × replicate values, replicate-major (every cell's first seed first)."""
    cell_keys = [(k, v) for k, v in swept if k not in REPLICATE_KEYS]
    replicate_keys = [(k, v) for k, v in swept if k in REPLICATE_KEYS]
    short = _short_names([k for k, _ in cell_keys])
    cells: list[tuple[str, dict[str, str], list[str]]] = [("", {}, [])]
    if variants:
        cells = [(name, {"variant": name}, list(overrides)) for name, overrides in variants]
    for key, values in cell_keys:
        cells = [(f"{name},{short[key]}={_unquoted(value)}".strip(","), {**settings, key: value},
                  [*overrides, f"{key}={value}"]) for name, settings, overrides in cells for value in values]
    replicates: list[dict[str, str]] = [{}]
    for key, values in replicate_keys:
        replicates = [{**r, key: value} for r in replicates for value in values]
    runs, used = [], set()
    cell_names = []
    for name, _, _ in cells:
        slug, n = _slug(name) if name else "", 1
        while slug in used:  # two names that differ only in characters a folder name cannot hold
            n += 1
            slug = f"{_slug(name)}~{n}"
        used.add(slug)
        cell_names.append(slug)
    for replicate in replicates:
        leaf = "-".join(f"{key.rsplit('.', 1)[-1]}{value}" for key, value in replicate.items()) or "run"
        for cell_name, (_, settings, overrides) in zip(cell_names, cells):
            runs.append(GridRun(f"{cell_name}/{leaf}" if cell_name else leaf, cell_name, settings, replicate,
                                [*overrides, *(f"{k}={v}" for k, v in replicate.items())]))
    return runs


def _merged(saved: Grid, new: Grid) -> Grid:
    """``saved`` with the runs of ``new`` it lacks; a grid of another base or other fixed settings is refused."""
    if saved.base != new.base or saved.fixed != new.fixed:
        what = "base configuration" if saved.base != new.base else "fixed settings"
        raise ConfigError(f"{saved.folder} holds a grid with another {what} ({saved.base or 'none'}, "
                          f"{' '.join(saved.fixed) or 'no fixed overrides'}); continue it with maskattn grid run "
                          f"--out {saved.folder} alone, or give this grid a new --out")
    known = {run.name: run for run in saved.runs}
    for run in new.runs:
        if run.name in known and known[run.name].overrides != run.overrides:
            raise ConfigError(f"run {run.name} of {saved.folder} was defined with other settings "
                              f"({' '.join(known[run.name].overrides)}); give this grid a new --out")
    saved.runs += [run for run in new.runs if run.name not in known]
    return saved


def check_runs(grid: Grid) -> list[RunConfig]:
    """Every run's configuration, built and checked before anything runs: the keys and values (as ``maskattn
    train`` checks them), a model that can be built from them (on a tiny vocabulary), the data folder and the
    vectors file. The first mistake raises :class:`ConfigError` naming the run."""
    from ..models.factory import build_model

    configs, built = [], {}
    for run in grid.runs:
        try:
            cfg = grid.config(run)
            model_key = json.dumps(cfg.model.__dict__, sort_keys=True, default=str)
            if cfg.model.pretrained is None and model_key not in built:
                build_model(cfg.model, 16, 3)
                built[model_key] = True
            _check_paths(cfg, Path(grid.cwd))
        except MaskattnError as exc:
            raise ConfigError(f"grid run {run.name} ({' '.join(run.overrides) or 'the base settings'}): {exc}") from None
        configs.append(cfg)
    return configs


def _check_paths(cfg: RunConfig, cwd: Path) -> None:
    def where(path: str) -> Path:
        return Path(path) if Path(path).is_absolute() else cwd / path
    if cfg.data.source == "files" and cfg.data.dir is not None and not where(cfg.data.dir).is_dir():
        raise ConfigError(f"data.dir {cfg.data.dir} is not a directory (relative to {cwd})")
    if cfg.data.vectors and not where(cfg.data.vectors).is_file():
        raise ConfigError(f"data.vectors {cfg.data.vectors} is not a file (relative to {cwd})")


def _worker_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    return env


@dataclass
class _Started:
    run: GridRun
    process: subprocess.Popen
    started: float


def run_grid(grid: Grid, *, jobs: int = 1, threads: int | None = None,
             say: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Run every unfinished run of ``grid`` (module docstring), ``jobs`` at a time with ``threads`` threads each
    (default: ``OMP_NUM_THREADS`` when it is set, else the CPU count shared out); returns the run names by outcome (``finished`` now, ``done`` earlier,
    ``busy`` in another process, ``failed``). Ctrl-C / SIGTERM stop the running runs, which keep their
    checkpoints (``KeyboardInterrupt`` is raised again once they have stopped)."""
    if jobs < 1:
        raise ConfigError(f"--jobs must be an int >= 1, got {jobs}")
    if threads is None:  # a thread budget already set for this process (OMP_NUM_THREADS), else the CPUs shared out
        given = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else max(1, (os.cpu_count() or 1) // jobs)
    if threads < 1:
        raise ConfigError(f"--threads must be an int >= 1, got {threads}")
    grid.folder.mkdir(parents=True, exist_ok=True)
    grid.save()
    outcome: dict[str, list[str]] = {"finished": [], "done": [], "busy": [], "failed": []}
    pending: list[str] = []
    for run in grid.runs:
        (outcome["done"] if read_summary(grid.folder / run.name) is not None else pending).append(run.name)
    say(f"grid {grid.folder}: {len(grid.runs)} runs, {len(outcome['done'])} finished earlier, {len(pending)} to run, "
        f"{jobs} at a time with {threads} thread(s) each")
    runs = {run.name: run for run in grid.runs}
    running: list[_Started] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                running.append(_start(grid, runs[pending.pop(0)], threads))
            time.sleep(0.2)
            for started in [s for s in running if s.process.poll() is not None]:
                running.remove(started)
                _report(grid, started, outcome, say)
    except KeyboardInterrupt:
        for started in running:
            started.process.terminate()  # the worker stops like Ctrl-C: its checkpoints stay
        for started in running:
            started.process.wait()
        say(f"grid stopped: {len(running)} run(s) interrupted; run the same command again to continue")
        raise
    return outcome


def _start(grid: Grid, run: GridRun, threads: int) -> _Started:
    folder = grid.folder / run.name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", WORKER, str(grid.folder.resolve()), run.name, str(threads)],
                                   cwd=grid.cwd, env=_worker_env(threads), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    return _Started(run, process, time.perf_counter())


def _report(grid: Grid, started: _Started, outcome: dict[str, list[str]], say: Callable[[str], None]) -> None:
    name, code = started.run.name, started.process.returncode
    seconds = time.perf_counter() - started.started
    if code == BUSY_EXIT:
        outcome["busy"].append(name)
        say(f"{name}: held by another process, left to it")
        return
    summary = read_summary(grid.folder / name)
    if code == 0 and summary is not None:
        outcome["finished"].append(name)
        test = summary.get("test", {}).get(summary.get("metric"))
        result = f"test {summary.get('metric')} {test:.4f}" if isinstance(test, float) else "no test split"
        say(f"{name}: finished in {seconds:.0f} s, {result}")
        return
    outcome["failed"].append(name)
    log = grid.folder / name / "train.log"
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    say(f"{name}: failed (exit status {code}): {lines[-1] if lines else 'no output'} (log: {log})")


def run_one(grid_folder: str | Path, name: str, threads: int) -> int:
    """Run the run ``name`` of the grid in ``grid_folder`` to its end with ``threads`` threads (what the process of
    a run, :data:`WORKER`, does); the exit status: 0, or :data:`BUSY_EXIT` when another process holds the run."""
    from .resumable import run_to_end

    grid = load_grid(grid_folder)
    run = next((r for r in grid.runs if r.name == name), None)
    if run is None:
        raise ConfigError(f"grid {grid_folder} has no run {name!r}")
    folder = grid.folder / run.name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / _WORKER_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return BUSY_EXIT
        summary, _ = run_to_end(grid.config(run, [f"train.num_threads={threads}"]))
        print(json.dumps(summary))
    return 0
