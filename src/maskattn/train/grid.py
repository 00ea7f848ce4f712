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
run another process holds is left to it. With ``launcher="slurm"`` the runs are Slurm jobs (a job array through
submitit) running the same worker, requeued at their time limit (:mod:`maskattn.train.launchers`, docs/cluster.md).

Before any run starts every run's configuration is built and checked (an unknown key, a value of the wrong type or
range, a model that cannot be built, a missing data folder or vectors file): one mistake refuses the whole grid.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.text import read_yaml
from ..errors import ArgumentError, ConfigError, MaskattnError
from ..sections import parse_yaml, shown
from .resumable import read_summary, write_json

if TYPE_CHECKING:
    from .config import RunConfig
    from .launchers import SlurmOptions

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
#: the most runs a grid may have, unless :data:`MAX_RUNS_ENV` says otherwise (counted before any is built)
MAX_RUNS = 10_000
MAX_RUNS_ENV = "MASKATTN_GRID_MAX_RUNS"


def max_runs() -> int:
    """The most runs a grid may have: ``MASKATTN_GRID_MAX_RUNS`` when set, else :data:`MAX_RUNS`."""
    text = os.environ.get(MAX_RUNS_ENV, "").strip().replace("_", "").replace(",", "")
    if not text:
        return MAX_RUNS
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{MAX_RUNS_ENV}={os.environ[MAX_RUNS_ENV]!r}: expected the most runs a grid may have, an "
                          "int >= 1")
    return int(text)


def _too_many(count: int, what: str, limit: int) -> ConfigError:
    return ConfigError(f"{what} {count:,} runs, more than the {limit:,} a grid may have; sweep fewer values, or raise "
                       f"the limit ({MAX_RUNS_ENV}={count})")


def split_values(text: str, *, limit: int | None = None) -> list[str]:
    """The values of one override's value text, in Hydra's multirun spelling (module docstring): the pieces between
    commas outside brackets, braces, parentheses and quotes, or the numbers of ``range(start, stop[, step])`` —
    counted before they are built: a range of more than ``limit`` values (default :func:`max_runs`) is refused."""
    if match := _RANGE.match(text.strip()):
        return _range_values(match.group(1), text, max_runs() if limit is None else limit)
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


def _range_values(arguments: str, text: str, limit: int) -> list[str]:
    pieces = arguments.split(",")
    parsed = [parse_yaml(a, f"value {shown(text)}") for a in pieces] if 2 <= len(pieces) <= 3 else []
    numbers = [n for n in parsed if isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n)]
    if not numbers or len(numbers) != len(parsed):
        raise ConfigError(f"value {shown(text)}: expected range(start, stop) or range(start, stop, step) with finite "
                          "numbers")
    start, stop, step = (numbers + [1])[:3]
    if step == 0:
        raise ConfigError(f"value {text!r}: the step of a range cannot be 0")

    def inside(value) -> bool:
        return value < stop if step > 0 else value > stop
    if all(isinstance(n, int) for n in (start, stop, step)):
        count = int(max(0, -((start - stop) // step)))  # exact: ceil((stop - start) / step)
    else:  # start + i·step for every i that stays inside (no accumulated rounding for float steps)
        span = (stop - start) / step
        if not span <= limit + 2:  # also inf: refused by its size, before anything is counted one by one
            raise ConfigError(f"value {shown(text)}: a range of about {span:.3g} values, more than the {limit:,} runs "
                              f"a grid may have; sweep fewer values, or raise the limit ({MAX_RUNS_ENV})")
        count = max(0, math.ceil(span))
        while count and not inside(start + (count - 1) * step):
            count -= 1
        while inside(start + count * step):
            count += 1
    if not count:
        raise ConfigError(f"value {text!r}: the range is empty")
    if count > limit:
        raise _too_many(count, f"value {shown(text)}: a range of", limit)
    values = [start + i * step for i in range(count)]
    # a float step's rounding shows in the runs' names (0.1 + 2 · 0.1 = 0.30000000000000004): 12 significant digits
    return [str(v) if isinstance(v, int) else repr(float(f"{v:.12g}")) for v in values]


def parse_seeds(text: str, *, limit: int | None = None) -> list[int]:
    """``0-4``, ``0,2,5``, ``range(0,5)`` or a mix of the first two (``0-2,7``) → the seeds, in order, once each;
    more than ``limit`` seeds (default :func:`max_runs`) are refused before they are built."""
    limit = max_runs() if limit is None else limit
    spans: list[tuple[int, int]] = []
    for piece in split_values(text, limit=limit) if "range(" in text else [p.strip() for p in text.split(",")]:
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", piece)
        if not match or (match.group(2) is not None and int(match.group(2)) < int(match.group(1))):
            raise ConfigError(f"--seeds {shown(text)}: expected seeds such as 0-4 or 0,1,2 (non-negative ints, ranges "
                              "low-high)")
        spans.append((int(match.group(1)), int(match.group(2) or match.group(1))))
    count = sum(high - low + 1 for low, high in spans)  # at least the seeds there will be (before duplicates go)
    if count > limit:
        raise _too_many(count, f"--seeds {shown(text)}: seeds for", limit)
    return list(dict.fromkeys(s for low, high in spans for s in range(low, high + 1)))


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
    #: a folder for TensorBoard event files: each run writes into ``<tensorboard>/<cell>/<seed>`` (its run name)
    tensorboard: str | None = None

    def base_path(self) -> Path | None:
        if "preset" in self.base:
            from .config import preset_path  # torch: only where a run's configuration is built

            return preset_path(self.base["preset"])
        return Path(self.base["config"]) if "config" in self.base else None

    def run_folder(self, run: GridRun) -> str:
        """The run's folder as its configuration records it: relative to the working directory when the grid lies
        inside it (its processes run there), else absolute."""
        folder = self.folder.resolve() / run.name
        return os.path.relpath(folder, self.cwd) if Path(self.cwd) in folder.parents else str(folder)

    def config(self, run: GridRun, extra: Sequence[str] = ()) -> RunConfig:
        """The run's full configuration: base ← fixed overrides ← the run's ← its folder ← ``extra``."""
        board = [f"train.tensorboard={self.tensorboard}"] if self.tensorboard else []
        overrides = [*self.fixed, *run.overrides, f"train.out_dir={self.run_folder(run)}", "train.progress=false",
                     *board, *extra]
        # a TensorBoard folder given to the grid is each run's sub-folder of it, so one --logdir shows the grid
        overrides = [f"{item}/{run.name}" if item.startswith("train.tensorboard=") and item.split("=", 1)[1].strip()
                     not in ("", "null", "~") else item for item in overrides]
        from .config import load_config

        return load_config(self.base_path(), overrides)

    def plan(self) -> list[tuple[GridRun, str, str]]:
        """What running the grid now would do with each run: ``(run, state, detail)``, the state ``finished`` (its
        summary is there and its configuration is the run's: kept), ``new``, ``continue`` (started, not finished) or
        ``refused`` (its folder holds a run of another configuration; ``detail`` says how). Reads the run folders
        only: no data, no model."""
        from .resumable import check_same_run

        plan = []
        for run in self.runs:
            folder = self.folder / run.name
            try:
                check_same_run(self.config(run), folder)
                finished = read_summary(folder) is not None
            except MaskattnError as exc:
                plan.append((run, "refused", str(exc)))
                continue
            started = (folder / "config.yaml").is_file() or (folder / "metrics.jsonl").is_file()
            plan.append((run, "finished" if finished else "continue" if started else "new", ""))
        return plan

    def save(self) -> None:
        """Write ``grid.json``; the working directory relative to the grid folder (a clone elsewhere, or a copy of
        the repository, means its own), the base configuration file relative to the working directory when inside it."""
        base = dict(self.base)
        if "config" in base and Path(self.cwd) in Path(base["config"]).resolve().parents:
            base["config"] = os.path.relpath(Path(base["config"]).resolve(), self.cwd)
        write_json(self.folder / MANIFEST, {"format": FORMAT, "base": base, "fixed": self.fixed,
                                            "cwd": os.path.relpath(self.cwd, self.folder.resolve()),
                                            **({"tensorboard": self.tensorboard} if self.tensorboard else {}),
                                            "runs": [run.to_dict() for run in self.runs]})


def load_grid(folder: str | Path) -> Grid:
    """The grid in ``folder`` (its ``grid.json``); a folder without one raises :class:`ConfigError`. A relative
    ``cwd`` is relative to the grid folder, a relative base ``config`` to that working directory."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{folder} holds no grid ({MANIFEST} not found); start one with maskattn grid run --out "
                          f"{folder} and its settings")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        runs = [GridRun(**run) for run in data["runs"]]
        cwd = Path(data["cwd"]) if Path(data["cwd"]).is_absolute() else (folder / data["cwd"]).resolve()
        base = dict(data["base"])
        if "config" in base and not Path(base["config"]).is_absolute():
            base["config"] = str(cwd / base["config"])
        if not all(isinstance(run.name, str) and isinstance(run.cell, str) for run in runs):
            raise TypeError("a run's name or cell is not a text")
        return Grid(folder, base, list(data["fixed"]), str(cwd), runs, data.get("tensorboard"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
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
    if not re.fullmatch(r"[A-Za-z0-9._+-]{1,80}", name) or set(name) == {"."}:
        raise ConfigError(f"{where}: a variant's name (its folder in the grid) is 1 to 80 letters, digits, '.', '_', "
                          f"'+', '-', and not '.' or '..'; got {shown(name)}")
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
        read = read_yaml(path, "variants file") or {}  # guarded: size, aliases, nesting (maskattn.sections)
        if not isinstance(read, dict):
            raise ConfigError(f"variants file {path} must hold a mapping of variant names to settings")
        known = read
    variants = []
    for item in items:
        name, equals, mapping = item.partition("=")
        if equals:
            settings = parse_yaml(mapping, f"variant {shown(item)}: the settings") if mapping.strip() else {}
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
                seeds: str | None = None, cwd: str | Path | None = None, run_limit: int | None = None,
                say: Callable[[str], None] | None = None) -> Grid:
    """The grid of these settings in ``folder`` (module docstring), with every run's configuration checked
    (:func:`check_runs`). ``variants``: ``NAME={section.key: value, ...}``, or ``NAME`` of a variant of
    ``variants_file`` (a YAML mapping of names to settings; all of them when ``variants`` is empty). An existing grid
    in ``folder`` gains the runs it lacks; one with another base or other fixed overrides is refused.

    The runs are counted before they are built: more than ``run_limit`` (default :func:`max_runs`, 10,000, or
    ``MASKATTN_GRID_MAX_RUNS``) are refused with the count. A setting given twice is refused. ``say`` receives a
    progress line every few seconds while a large grid is checked."""
    if preset and config:
        raise ConfigError("give either --config or --preset, not both")
    limit = max_runs() if run_limit is None else run_limit
    folder = Path(folder)
    base = {"preset": preset} if preset else {"config": str(Path(config).resolve())} if config else {}
    fixed: list[str] = []
    swept: list[tuple[str, list[str]]] = []
    given: dict[str, str] = {}  # the fixed value of each key (a swept key's values replace it in its runs)
    for item in overrides:
        key, value = _parse_override(item)
        if key == "train.out_dir":
            raise ConfigError(f"override {item!r}: each run of a grid has its own folder inside the grid's (--out)")
        values = split_values(value, limit=limit)
        if len(values) > 1:
            if any(k == key for k, _ in swept):
                raise ConfigError(f"{key} is swept twice; give its values once, e.g. {key}=a,b,c")
            swept.append((key, values))
        elif key in given and given[key] != values[0]:  # silently taking the last trains what was not asked for
            raise ConfigError(f"{key} is given twice, {shown(given[key])} and {shown(values[0])}; give it once"
                              + (" (--data sets data.dir)" if key == "data.dir" else "")
                              + f", or sweep both values: {key}={given[key]},{values[0]}")
        else:
            given[key] = values[0]
            fixed.append(f"{key}={values[0]}")
    if seeds is not None:
        if any(k == "train.seed" for k, _ in swept) or any(f.startswith("train.seed=") for f in fixed):
            raise ConfigError("give the seeds either with --seeds or with --set train.seed=..., not both")
        swept.append(("train.seed", [str(s) for s in parse_seeds(seeds, limit=limit)]))
    named = _parse_variants(variants, variants_file)
    count = max(1, len(named))
    for _, values in swept:
        count *= len(values)
    if count > limit:  # counted before a single run is built
        factors = ([f"{len(named)} variants"] if named else []) + [f"{len(v):,} values of {k}" for k, v in swept]
        raise _too_many(count, f"the grid would have {' × '.join(factors)} =", limit)
    grid = Grid(folder, base, fixed, str(Path(cwd or os.getcwd()).resolve()), _runs(swept, named))
    check_runs(grid, say=say)
    if (folder / MANIFEST).is_file():
        grid = _merged(load_grid(folder), grid)
        check_run_folders(grid)
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
        leaf = "-".join(f"{key.rsplit('.', 1)[-1]}{_slug(value)}" for key, value in replicate.items()) or "run"
        for cell_name, (_, settings, overrides) in zip(cell_names, cells):
            runs.append(GridRun(f"{cell_name}/{leaf}" if cell_name else leaf, cell_name, settings, replicate,
                                [*overrides, *(f"{k}={v}" for k, v in replicate.items())]))
    return runs


def _merged(saved: Grid, new: Grid) -> Grid:
    """``saved`` with the runs of ``new`` it lacks; a grid of another base or other fixed settings is refused."""
    if saved.base != new.base or saved.fixed != new.fixed:
        if saved.base != new.base:
            what = f"another base configuration ({saved.base or 'none'}; this command gives {new.base or 'none'})"
        else:  # name the settings that differ, not the whole list
            old, now = [f for f in saved.fixed if f not in new.fixed], [f for f in new.fixed if f not in saved.fixed]
            what = (f"other fixed settings (it has {' '.join(old) or 'no other'}; this command gives "
                    f"{' '.join(now) or 'none of them'})")
        raise ConfigError(f"{saved.folder} holds a grid with {what}; continue it with maskattn grid run "
                          f"--out {saved.folder} alone, or give this grid a new --out")
    known = {run.name: run for run in saved.runs}
    for run in new.runs:
        if run.name in known and known[run.name].overrides != run.overrides:
            raise ConfigError(f"run {run.name} of {saved.folder} was defined with other settings "
                              f"({' '.join(known[run.name].overrides)}); give this grid a new --out")
    saved.runs += [run for run in new.runs if run.name not in known]
    return saved


#: files a grid run writes into its folder: a folder holding none of them is not a run's (a user's)
_RUN_MARKERS = ("train.log", _WORKER_LOCK, ".run-files.json", "config.yaml", "summary.json", "metrics.jsonl",
                "launch.json", "worker.json")  # the last two: maskattn.train.launchers' LAUNCH_RECORD, WORKER_RECORD


def check_run_folders(grid: Grid) -> None:
    """Every run's folder lies strictly inside the grid's folder — also through symbolic links —, no run's folder
    lies inside another's, and none is a folder or file of the user's (something there, none of it a run's): the one
    check every run's folder goes through before anything is written (a name from a variant, a swept value, a cell or
    a hand-edited ``grid.json``). A folder that fails is :class:`ConfigError` naming it."""
    root = grid.folder.resolve()
    names = {run.name for run in grid.runs}
    for run in grid.runs:
        parts = run.name.split("/")
        folder = grid.folder / run.name
        resolved = folder.resolve()
        if (not run.name or run.name.startswith("/") or any(part in ("", ".", "..") for part in parts)
                or "\\" in run.name or not resolved.is_relative_to(root) or resolved == root):
            raise ConfigError(f"grid run {shown(run.name)}: its folder {folder} is not inside the grid's folder "
                              f"{root}; a run's folder is named by its variant, swept values and seed: rename what made "
                              "it")
        inner = next(("/".join(parts[:i]) for i in range(1, len(parts)) if "/".join(parts[:i]) in names), None)
        if inner is not None:
            raise ConfigError(f"grid run {run.name}: its folder lies inside the folder of run {inner}; give this grid "
                              "a new --out")
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise ConfigError(f"grid run {run.name}: {folder} is {'a link' if folder.is_symlink() else 'a file'}, "
                              "where the run's folder goes; move it away or give this grid a new --out")
        if folder.is_dir():
            entries = sorted(p.name for p in folder.iterdir())
            if entries and not any(name in entries for name in _RUN_MARKERS):
                raise ConfigError(f"grid run {run.name}: {folder} holds {', '.join(entries[:5])}"
                                  f"{', …' if len(entries) > 5 else ''}, which no grid run wrote; move it away or give "
                                  "this grid a new --out")


def check_runs(grid: Grid, *, say: Callable[[str], None] | None = None) -> list[RunConfig]:
    """Every run's configuration, built and checked before anything runs: its folder (:func:`check_run_folders`),
    the keys and values (as ``maskattn train`` checks them), a model that can be built from them (on a tiny
    vocabulary, on the ``meta`` device: shapes only, no memory), the data folder and the vectors file. The first
    mistake raises :class:`ConfigError` naming the run. ``say`` gets a progress line every few seconds."""
    import torch

    from ..models.factory import build_model

    check_run_folders(grid)
    configs, built = [], {}
    started = shown_at = time.monotonic()
    for number, run in enumerate(grid.runs, start=1):
        try:
            cfg = grid.config(run)
            model_key = json.dumps(cfg.model.__dict__, sort_keys=True, default=str)
            if cfg.model.pretrained is None and model_key not in built:
                with torch.device("meta"):  # what the model holds is checked elsewhere: here its settings
                    build_model(cfg.model, 16, 3)
                built[model_key] = True
            _check_paths(cfg, Path(grid.cwd))
        except MaskattnError as exc:
            raise ConfigError(f"grid run {run.name} ({' '.join(run.overrides) or 'the base settings'}): {exc}") from None
        configs.append(cfg)
        if say is not None and time.monotonic() - shown_at >= 2 and number < len(grid.runs):
            shown_at = time.monotonic()
            say(f"checking the runs' configurations: {number:,} of {len(grid.runs):,} "
                f"({shown_at - started:.0f} s)")
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
    env.pop("MASKATTN_GRID_PARENT", None)  # set by the launcher that starts the worker (cli/grid_worker.py)
    return env


@dataclass
class _Started:
    run: GridRun
    process: subprocess.Popen
    started: float


def run_grid(grid: Grid, *, jobs: int | None = None, threads: int | None = None,
             say: Callable[[str], None] = print, launcher: str = "local", slurm: SlurmOptions | None = None,
             wait: bool = False, poll_s: float = 2.0) -> dict[str, list[str]]:
    """Run every unfinished run of ``grid`` (module docstring). ``launcher="local"``: ``jobs`` at a time (default 1)
    with ``threads`` threads each (default: ``OMP_NUM_THREADS`` when it is set, else the CPU count shared out), here,
    until all have ended; ``launcher="slurm"``: as Slurm jobs (:mod:`maskattn.train.launchers`; ``slurm``: what
    they ask for; ``jobs``: how many run at once, default no limit; ``threads``: default ``cpus_per_task``, else 1),
    returning once they are submitted unless ``wait``. Returns the run names by outcome: ``finished`` now, ``done``
    earlier, ``busy`` in another process, ``queued`` (or running) in Slurm already, left to it, ``submitted`` to
    Slurm now, ``failed``, ``stopped`` (a Slurm job that ended before its run finished). Ctrl-C / SIGTERM stop the
    local runs, which keep their checkpoints (``KeyboardInterrupt`` is raised again once they have stopped); Slurm
    jobs go on."""
    from .launchers import LAUNCHERS, SlurmOptions

    if launcher not in LAUNCHERS:
        raise ArgumentError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"--jobs must be an int >= 1, got {jobs}")
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be an int >= 1, got {threads}")
    if launcher == "slurm":
        return _run_slurm(grid, jobs, threads, slurm or SlurmOptions(), say, wait, poll_s)
    jobs = jobs or 1
    if threads is None:  # a thread budget already set for this process (OMP_NUM_THREADS), else the CPUs shared out
        given = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else max(1, (os.cpu_count() or 1) // jobs)
    grid.folder.mkdir(parents=True, exist_ok=True)
    grid.save()
    outcome: dict[str, list[str]] = {name: [] for name in _OUTCOMES}
    pending: list[str] = []
    in_slurm = _in_slurm(grid)
    for run in grid.runs:
        if read_summary(grid.folder / run.name) is not None:
            outcome["done"].append(run.name)
        elif run.name in in_slurm:
            outcome["queued"].append(run.name)
        else:
            pending.append(run.name)
    say(f"grid {grid.folder}: {len(grid.runs)} runs, {len(outcome['done'])} finished earlier, {len(pending)} to run, "
        f"{jobs} at a time with {threads} thread(s) each")
    for name in outcome["queued"]:
        say(f"{name}: {in_slurm[name]}, left to it")
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


_OUTCOMES = ("finished", "done", "busy", "failed", "queued", "submitted", "stopped")


def _in_slurm(grid: Grid) -> dict[str, str]:
    """The runs of ``grid`` whose Slurm job is queued or running (run name → ``queued in Slurm job 12_3``)."""
    from .launchers import LAUNCH_RECORD, _live_state, read_record, slurm_states

    launches = {run.name: read_record(grid.folder / run.name, LAUNCH_RECORD) for run in grid.runs}
    if not any(launch.get("launcher") == "slurm" for launch in launches.values()):
        return {}
    states = slurm_states()
    found = {}
    for name, launch in launches.items():
        if (live := _live_state(launch, states)) is not None:
            found[name] = f"{live} in Slurm job {launch['job_id']}"
    return found


def _run_slurm(grid: Grid, jobs: int | None, threads: int | None, options: SlurmOptions,
               say: Callable[[str], None], wait: bool, poll_s: float) -> dict[str, list[str]]:
    """``run_grid`` with ``launcher="slurm"``: submit what is neither finished nor queued, running or held."""
    from .launchers import SLURM_FOLDER, check_slurm, follow_slurm, is_held, submit_lock, submit_slurm

    options.check()
    threads = threads or options.cpus_per_task or 1
    check_slurm()
    grid.folder.mkdir(parents=True, exist_ok=True)
    grid.save()
    outcome: dict[str, list[str]] = {name: [] for name in _OUTCOMES}
    runs = {run.name: run for run in grid.runs}
    with submit_lock(grid.folder):  # a second grid run on this folder waits, then sees these jobs
        in_slurm = _in_slurm(grid)
        pending = []
        for run in grid.runs:
            folder = grid.folder / run.name
            if read_summary(folder) is not None:
                outcome["done"].append(run.name)
            elif run.name in in_slurm:
                outcome["queued"].append(run.name)
            elif is_held(folder):
                outcome["busy"].append(run.name)
            else:
                pending.append(run.name)
        say(f"grid {grid.folder}: {len(grid.runs)} runs, {len(outcome['done'])} finished earlier, "
            f"{len(outcome['queued'])} queued or running in Slurm, {len(outcome['busy'])} held by another process, "
            f"{len(pending)} to submit ({threads} thread(s) each"
            f"{f', {jobs} at a time' if jobs else ''})")
        for name in outcome["queued"]:
            say(f"{name}: {in_slurm[name]}, left to it")
        for name in outcome["busy"]:
            say(f"{name}: held by another process, left to it")
        submitted = submit_slurm(grid, [runs[name] for name in pending], options, threads=threads,
                                 parallelism=jobs) if pending else {}
    outcome["submitted"] = list(submitted)
    if submitted:
        ids = list(submitted.values())
        say(f"submitted {len(ids)} run(s): Slurm job{'s' if len(ids) > 1 else ''} {ids[0]}"
            f"{f' … {ids[-1]}' if len(ids) > 1 else ''}; their files: {grid.folder / SLURM_FOLDER}")
    if wait:
        live = {name: str(_launch_job(grid, name)) for name in outcome["queued"]}
        follow_slurm(grid, {**submitted, **live}, outcome, say, poll_s)
    return outcome


def _launch_job(grid: Grid, name: str) -> str | None:
    from .launchers import LAUNCH_RECORD, read_record

    return read_record(grid.folder / name, LAUNCH_RECORD).get("job_id")


def _start(grid: Grid, run: GridRun, threads: int) -> _Started:
    from .launchers import LAUNCH_RECORD

    folder = grid.folder / run.name
    folder.mkdir(parents=True, exist_ok=True)
    env = {**_worker_env(threads), "MASKATTN_GRID_PARENT": str(os.getpid())}  # the worker dies with this process
    submitted = time.time()
    with open(folder / "train.log", "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", WORKER, str(grid.folder.resolve()), run.name, str(threads)],
                                   cwd=grid.cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    write_json(folder / LAUNCH_RECORD, {"launcher": "local", "submitted": submitted, "host": socket.gethostname(),
                                        "pid": process.pid})
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


def _train_beside(cfg: RunConfig) -> None:
    """What a process of ``torchrun`` other than the first does for a grid run: the same training as the first
    (:func:`~maskattn.train.resumable.run_to_end`'s choice: nothing when finished, resume from ``last.safetensors``
    or start), leaving the run folder's records to the first."""
    from .resumable import FREE_SETTINGS
    from .trainer import Trainer

    folder = Path(cfg.train.out_dir)
    if read_summary(folder, cfg.train.metric) is not None:
        return
    last = folder / "last.safetensors"
    if last.exists():
        free = {key: getattr(cfg.train, key) for section, key in sorted(FREE_SETTINGS) if section == "train"}
        Trainer.resume(last, train_overrides=free).fit()
    else:
        Trainer(cfg, overwrite=True).fit()


def run_one(grid_folder: str | Path, name: str, threads: int) -> int:
    """Run the run ``name`` of the grid in ``grid_folder`` to its end with ``threads`` threads (what the process of
    a run, :data:`WORKER`, does); the exit status: 0, or :data:`BUSY_EXIT` when another process holds the run. The
    worker's start and end are recorded in ``<run>/worker.json`` (:mod:`maskattn.train.launchers`). Under
    ``torchrun`` the first process holds the run and records it; the others train beside it."""
    from .launchers import WORKER_RECORD
    from .resumable import run_to_end

    grid = load_grid(grid_folder)
    run = next((r for r in grid.runs if r.name == name), None)
    if run is None:
        raise ConfigError(f"grid {grid_folder} has no run {name!r}")
    folder = grid.folder / run.name
    folder.mkdir(parents=True, exist_ok=True)
    if int(os.environ.get("RANK", "0")) != 0:  # a process of torchrun beside the first one
        _train_beside(grid.config(run, [f"train.num_threads={threads}"]))
        return 0
    with open(folder / _WORKER_LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return BUSY_EXIT
        job = os.environ.get("SLURM_JOB_ID")
        if os.environ.get("SLURM_ARRAY_TASK_ID") and os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
        record: dict = {"host": socket.gethostname(), "pid": os.getpid(), "job_id": job, "started": time.time()}
        write_json(folder / WORKER_RECORD, record)
        try:
            summary, _ = run_to_end(grid.config(run, [f"train.num_threads={threads}"]))
        except KeyboardInterrupt:
            write_json(folder / WORKER_RECORD, {**record, "ended": time.time(), "outcome": "interrupted"})
            raise
        except BaseException as exc:
            write_json(folder / WORKER_RECORD, {**record, "ended": time.time(), "outcome": "failed",
                                                "error": f"{type(exc).__name__}: {exc}"[:2000]})
            raise
        write_json(folder / WORKER_RECORD, {**record, "ended": time.time(), "outcome": "finished"})
        print(json.dumps(summary))
    return 0
