"""A grid's definition (``maskattn grid run`` / ``grid cost``): its sweep grammar, its runs, its manifest and its
plan — what a grid *is*, before anything runs. Running it is :mod:`maskattn.grid.scheduler`'s, reading what its runs
did :mod:`maskattn.grid.records`'.

A grid is a base configuration (a preset or a YAML file) and ``section.key=value`` overrides, where a value may
list several values (:func:`split_values`, the sweep grammar below). Named variants bundle several settings into one
row (``mha={model.encoder: mha, model.positional: sinusoidal}``; or a file of them, ``--variants``), and seeds
(``0-4``, ``0,2``) repeat every cell. The runs are the product variants × swept values × seeds (× ``data.fold``
values, the other replicate axis), counted before any is built: more than :func:`max_runs` are refused.

Every run has its own folder, ``<grid>/<cell>/seed<k>`` (``-fold<f>`` when folds are swept), where a grid run writes
its run's files and its own (:data:`RUN_LOG`, :data:`LAUNCH_RECORD`, :data:`WORKER_RECORD`, :data:`WORKER_LOCK`).
``<grid>/grid.json`` is the grid's manifest — the base, the fixed overrides, the working directory and every run
with its overrides —, so ``maskattn grid run --out <grid>`` alone continues a grid, and the same command with more
seeds or values adds runs to it (:func:`define_grid` merges them). Before any run starts every run's folder and
configuration is built and checked (:func:`check_run_folders`, :func:`check_runs`: an unknown key, a value of the
wrong type or range, a model that cannot be built, a missing data folder or vectors file): one mistake refuses the
whole grid. :meth:`Grid.plan` says what running it now would do with each run (``grid run --dry-run``).

**The sweep grammar** is a subset of Hydra's override grammar (the multirun spelling users of Hydra know), read by
hand here:

* a *simple choice sweep*, ``model.encoder=mtsa,mha``: the value splits at commas outside quotes (``'…'``,
  ``"…"``), brackets, braces and parentheses, so ``'csan2d x3, mha x3'``, ``[1,2]`` and ``{a: 1, b: 2}`` are one
  value each; the pieces are kept as written (quotes too: each is then read as YAML, as a fixed ``--set`` value);
* a *range sweep*, ``range(start, stop)`` / ``range(start, stop, step)`` of ints or finite floats (a float step's
  values rounded to 12 significant digits), counted before it is expanded.

Not accepted (each is then one plain value, or refused): Hydra's one-argument ``range(stop)``, ``choice(…)``,
``interval(…)``, ``glob(…)``, ``sort(…)``, ``shuffle(…)``, ``tag(…)``, interpolations ``${…}``, escapes (a backslash
escapes nothing: ``a\\,b`` is two values) and the ``+key`` / ``++key`` / ``~key`` prefixes. Why not Hydra's own parser
(``hydra.core.override_parser.overrides_parser.OverridesParser``, hydra-core 1.3): it would add hydra-core, omegaconf
and an ANTLR runtime pinned to 4.9 (8.6 MB) for one function and ~0.1 s of CPU to import; it expands a range before
it can be counted (``range(0,1000000000)`` builds its billion values); and it changes what a grid records — the
quotes of a quoted value are dropped, ``1e-3`` becomes ``0.001`` and ``range(0,1,0.1)`` gives
``0.7000000000000001``, so run folders and manifests would be named differently — and its errors are ANTLR's
(``mismatched input '<EOF>' expecting …``), not one line naming the override.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.text import MAX_TEXT_BYTES, read_text, read_yaml
from ..errors import ConfigError, MaskattnError
from ..sections import parse_yaml, shown
from ..train.resumable import SUMMARY, read_summary, write_json

if TYPE_CHECKING:
    from ..train.config import RunConfig

__all__ = ["GridRun", "Grid", "define_grid", "load_grid", "check_run_folders", "check_runs", "split_values",
           "parse_seeds", "max_runs", "MANIFEST", "REPLICATE_KEYS", "RUN_LOG", "LAUNCH_RECORD", "WORKER_RECORD",
           "WORKER_LOCK", "MAX_RUNS", "MAX_RUNS_ENV"]

#: the grid's manifest in its folder
MANIFEST = "grid.json"
FORMAT = "maskattn-grid/1"
#: keys whose values repeat a cell rather than define one (a table averages over them)
REPLICATE_KEYS = ("train.seed", "data.fold")
#: what a grid run writes into its run's folder beside the run's own files: the worker's output, the launcher's record
#: (``launch.json``), the worker's (``worker.json``) and the lock the worker holds while it trains the run
#: (:mod:`maskattn.grid.records` reads them)
RUN_LOG = "train.log"
LAUNCH_RECORD = "launch.json"
WORKER_RECORD = "worker.json"
WORKER_LOCK = ".grid-worker"
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
            from ..train.config import preset_path  # torch: only where a run's configuration is built

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
        from ..train.config import load_config

        return load_config(self.base_path(), overrides)

    def plan(self) -> list[tuple[GridRun, str, str]]:
        """What running the grid now would do with each run: ``(run, state, detail)``, the state ``finished`` (its
        summary is there and its configuration is the run's: kept), ``new``, ``continue`` (started, not finished) or
        ``refused`` (its folder holds a run of another configuration; ``detail`` says how). Reads the run folders
        only: no data, no model."""
        from ..train.resumable import check_same_run

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
    try:  # bounded: a few hundred bytes per run, at most max_runs() runs (a larger file is not a manifest)
        data = json.loads(read_text(path, "grid manifest", max_bytes=max(MAX_TEXT_BYTES, max_runs() * 4096)))
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
_RUN_MARKERS = (RUN_LOG, WORKER_LOCK, ".run-files.json", "config.yaml", SUMMARY, "metrics.jsonl", LAUNCH_RECORD,
                WORKER_RECORD)


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

