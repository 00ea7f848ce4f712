"""The ``maskattn`` command line: ``train``, ``eval``, ``predict``, ``translate``, ``bench``, ``viz`` (``masks``,
``attention``, ``localness``), ``list``, ``demo``.

``maskattn train`` with no arguments runs the embedded default job (the synthetic order task, MTSA vs
multi-head attention). Multi-process data-parallel training: ``torchrun --nproc_per_node N -m maskattn.cli
train --config …``.

Errors: a mistake the user can fix — a :class:`~maskattn.errors.MaskattnError`, a ``ValueError`` from the
checks of arguments, configurations and files, an ``OSError`` (printed with its path) — is one line on stderr,
``error: …``, and exit code 2. Any other exception is a bug: it propagates with its traceback (exit code 1).
Every command reads its input lines with :mod:`maskattn.data.text` (``\\n`` only, one output per input line).
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import MaskattnError

app = typer.Typer(help="maskattn: mask-based self-attention (MTSA, MAN, CSAN) for PyTorch.", no_args_is_help=True,
                  add_completion=False)

#: what the commands report as a one-line message (exit code 2) instead of a traceback
USER_ERRORS = (MaskattnError, ValueError, OSError)


def _message(exc: BaseException) -> str:
    """The line printed for a user error: an ``OSError`` as ``path: reason``, anything else as its text."""
    if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        paths = f"{exc.filename} → {exc.filename2}" if exc.filename2 is not None else str(exc.filename)
        return f"{paths}: {exc.strerror}"
    return str(exc)


@contextmanager
def _user_errors() -> Iterator[None]:
    """Turn the user errors raised inside into ``error: …`` on stderr and exit code 2."""
    try:
        yield
    except USER_ERRORS as exc:
        Console(stderr=True).print(f"[red]error:[/red] {escape(_message(exc))}", markup=True, highlight=False,
                                   soft_wrap=True)  # one line, whatever the terminal's width: paths stay whole
        raise typer.Exit(code=2) from None


def _sigterm_as_interrupt() -> None:
    """SIGTERM (kill) stops training like Ctrl-C: checkpoints already written stay intact."""
    def handler(signum, frame):
        raise KeyboardInterrupt
    if sys.platform != "win32":
        signal.signal(signal.SIGTERM, handler)


@app.command()
def train(
    config: Path = typer.Option(None, "--config", "-c", help="YAML run configuration (sections data, model, optim, train)"),
    preset: str = typer.Option(None, "--preset", "-p", help="a preset shipped with maskattn (see `maskattn list`)"),
    data: Path = typer.Option(None, "--data", help="dataset folder (sets data.dir)"),
    out: Path = typer.Option(None, "--out", "-o", help="run folder for checkpoints and metrics (train.out_dir)"),
    seed: int = typer.Option(None, "--seed", help="train.seed"),
    max_steps: int = typer.Option(None, "--max-steps", help="train.max_steps"),
    device: str = typer.Option(None, "--device", help="train.device: auto, cpu, cuda"),
    resume: Path = typer.Option(None, "--resume", help="continue the run of this last.safetensors checkpoint"),
    overrides: list[str] = typer.Option(None, "--set", "-s", help="override: section.key=value (repeatable)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show the progress bar"),
    all_folds: bool = typer.Option(False, "--all-folds", help="train every fold of data.cv_folds into "
                                   "<out>/fold<i> and report the mean ± std test metric (<out>/cv.json)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the run already in the run folder (its "
                                   "checkpoints, metrics, config; deleted once this run holds the folder)"),
):
    """Train a model. With no arguments: the embedded default job (order task, MTSA vs multi-head).

    A run folder belongs to one process at a time, and a folder that holds a run is refused: continue that
    run with --resume <folder>/last.safetensors, replace it with --overwrite, or choose another --out."""
    from .train import api, default_job
    from .train.config import apply_overrides, load_config, preset_path

    flags = [f"{key}={value}" for key, value in (("data.dir", data), ("train.out_dir", out), ("train.seed", seed),
                                                  ("train.max_steps", max_steps), ("train.device", device))
             if value is not None] + list(overrides or [])
    _sigterm_as_interrupt()
    with _user_errors(), _interrupt_exits():
        if resume is not None:
            if all_folds:
                raise ValueError("--all-folds continues an interrupted cross-validation by itself: run the same "
                                 "command again, without --resume")
            if overwrite:
                raise ValueError("--overwrite starts a new run; --resume continues the run in the checkpoint's "
                                 "folder (give one or the other)")
            if config or preset or data:
                raise ValueError("--resume continues a run with its own configuration; drop --config/--preset/--data "
                                 "(train.* settings may be overridden)")
            extra = apply_overrides({}, flags)
            if set(extra) - {"train"}:
                raise ValueError(f"with --resume only train.* settings may change, got sections {sorted(extra)}")
            summary = api.resume(resume, train_overrides={**extra.get("train", {}),
                                                          **({} if progress else {"progress": False})})
        elif config is None and preset is None and data is None and not overrides and seed is None and device is None \
                and not all_folds:
            default_job.run_default_job(str(out or "runs/default"), max_steps=max_steps, progress=progress,
                                        overwrite=overwrite)
            return
        else:
            if config and preset:
                raise ValueError("give either --config or --preset, not both")
            path = config or (preset_path(preset) if preset else None)
            cfg = load_config(path, flags + ([] if progress else ["train.progress=false"]))
            summary = (api.cross_validate(cfg, console=Console(), overwrite=overwrite) if all_folds
                       else api.train(cfg, overwrite=overwrite))
    Console().print_json(json.dumps(summary))


@contextmanager
def _interrupt_exits() -> Iterator[None]:
    """Ctrl-C / SIGTERM end the command with exit code 130 (the trainer has said what it kept)."""
    try:
        yield
    except KeyboardInterrupt:
        raise typer.Exit(code=130) from None


@app.command("eval")
def eval_(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    data: Path = typer.Option(None, "--data", help="classifiers: labelled file to evaluate on"),
    format: str = typer.Option(None, "--format", help="tsv, trec, trec_fine, nli, conll (default: the checkpoint's)"),
    src: Path = typer.Option(None, "--src", help="translation: source sentences, one per line"),
    ref: Path = typer.Option(None, "--ref", help="translation: reference translations, line-aligned with --src"),
    beam: int = typer.Option(5, "--beam", help="translation: beam size (1 = greedy)"),
    length_penalty: float = typer.Option(0.6, "--length-penalty", help="translation: beam-search length penalty α"),
    batch_size: int = typer.Option(64, "--batch-size", help="translation: sentences per decoding batch"),
    device: str = typer.Option("cpu", "--device"),
):
    """Evaluate a checkpoint; prints the metrics as JSON. Classifiers: --data FILE. Translation: --src FILE
    --ref FILE (sacreBLEU BLEU and chrF with their signatures). Inputs longer than the model reads are
    truncated, with a warning listing their lines."""
    from .inference import evaluate_file, evaluate_translation

    with _user_errors():
        if src is not None or ref is not None:
            if src is None or ref is None or data is not None:
                raise ValueError("translation evaluation takes both --src FILE and --ref FILE (and no --data)")
            metrics = evaluate_translation(checkpoint, src, ref, beam=beam, length_penalty=length_penalty,
                                           batch_size=batch_size, device=device,
                                           on_truncate=_warn_truncated("subwords"))
        elif data is None:
            raise ValueError("nothing to evaluate: pass --data FILE (classifiers) or --src FILE --ref FILE "
                             "(translation)")
        else:
            metrics = evaluate_file(checkpoint, data, format=format, device=device,
                                    on_truncate=_warn_truncated("tokens"))
    Console().print_json(json.dumps(metrics))


def _warn_truncated(unit: str) -> Callable[[list[int], int], None]:
    """The ``on_truncate`` of the inference functions: say on stderr which input lines were cut to the model's
    limit of ``unit``."""
    def warn(lines: list[int], limit: int) -> None:
        shown = ", ".join(map(str, lines[:10])) + (", …" if len(lines) > 10 else "")
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {len(lines)} input line(s) longer than the model's "
                                   f"max_len were truncated to fit (the first {limit} {unit}): line(s) {shown}",
                                   markup=True, highlight=False)
    return warn


def _input_lines(path: Path | None) -> list[str]:
    """The lines of ``path``, or of stdin when it is ``None`` (:mod:`maskattn.data.text`)."""
    from .data.text import read_lines, read_stream_lines

    return read_lines(path) if path is not None else read_stream_lines(typer.get_binary_stream("stdin"))


@app.command()
def translate(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a translation .safetensors checkpoint"),
    input: Path = typer.Option(None, "--input", "-i", help="source sentences, one per line (default: stdin)"),
    output: Path = typer.Option(None, "--output", "-o", help="write translations here (default: stdout)"),
    beam: int = typer.Option(5, "--beam", help="beam size (1 = greedy)"),
    length_penalty: float = typer.Option(0.6, "--length-penalty", help="GNMT length penalty α of beam search"),
    batch_size: int = typer.Option(64, "--batch-size", help="sentences per decoding batch"),
    device: str = typer.Option("cpu", "--device"),
):
    """Translate sentences, one per line: one output line per input line (an empty line stays empty; a line
    longer than the model's max_len is truncated, with a warning on stderr)."""
    from .inference import load_translator

    with _user_errors():
        lines = _input_lines(input)
        translator = load_translator(checkpoint, device=device)
        outputs = translator.translate(lines, beam=beam, length_penalty=length_penalty, batch_size=batch_size,
                                       on_truncate=_warn_truncated("subwords"))
        text = "".join(line + "\n" for line in outputs)
        if output is not None:
            output.write_text(text, encoding="utf-8")
    if output is None:
        typer.echo(text, nl=False)


@app.command()
def predict(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    texts: list[str] = typer.Argument(None, help="sentences (pair models: 'premise ||| hypothesis')"),
    input: Path = typer.Option(None, "--input", "-i", help="file with one sentence per line"),
    device: str = typer.Option("cpu", "--device"),
):
    """Predict labels: one output line per input (the arguments, then the lines of --input), the label or a
    tagger's tags; a blank input line gives a blank output line. Inputs longer than the model reads are
    truncated, with a warning listing them."""
    from .inference import predict as run_predict

    with _user_errors():
        lines = list(texts or []) + (_input_lines(input) if input is not None else [])
        if not texts and input is None:
            raise ValueError("no input: pass sentences as arguments or --input FILE")
        labels = run_predict(checkpoint, lines, device=device, on_truncate=_warn_truncated("tokens"))
    for label in labels:
        typer.echo(" ".join(label) if isinstance(label, list) else label)


@app.command()
def demo(steps: int = typer.Option(300, min=1, help="training steps of the order task")):
    """Build MTSA, check every backend against the float64 reference, and train it on an order task."""
    from .demo import run_demo

    run_demo(steps=steps)


@app.command("list")
def list_mechanisms(
    backends: bool = typer.Option(False, "--backends", help="print the backend registry: each kernel family's "
                                                           "backends, what backend='auto' runs in each situation, "
                                                           "and what each backend cannot run"),
):
    """List the registered attention mechanisms, the models and context-fusion baselines, and the presets."""
    from . import attention_info, backend_limits_table, backend_table, backend_table_rows, list_attentions
    from .models import list_fusions, list_models
    from .train.config import PRESETS_DIR, list_presets

    console = Console()
    if backends:
        print(backend_table())
        print()
        for row in backend_table_rows():
            print(f"{row['family']}: {row['why']}")
        print()
        print(backend_limits_table())
        return
    table = Table(title="attention mechanisms (recipe names; also 'san' = mha, 'ffn')")
    for column in ("name", "class", "backends", "description"):
        table.add_column(column)
    for name in list_attentions():
        info = attention_info(name)
        table.add_row(name, info.cls.__name__, ", ".join(info.backends), escape(info.description))
    console.print(table)
    table = Table(title="models (model.type)")
    table.add_column("type")
    table.add_column("description")
    for name, description in list_models().items():
        table.add_row(name, escape(description))
    console.print(table)
    console.print("context-fusion baselines (model.encoder): " + ", ".join(list_fusions())
                  + "; anything else is a layer recipe, e.g. 'mtsa', 'csan2d x3, mha x3', 'dman>san>ffn x6'")
    console.print(f"presets ({PRESETS_DIR}): " + (", ".join(list_presets()) or "(none found)"))


_MAX_LENGTH_HELP = "the longest sentence / --length drawn, in positions (default 256; maps are n × n per head)"

viz_app = typer.Typer(help="Draw masks, attention maps of trained models (classifiers; the encoder of translation "
                           "models) and MAN's localness table (Table 5).",
                      no_args_is_help=True)
app.add_typer(viz_app, name="viz")


def _show(grid, out: Path | None, terminal: bool, title: str, dpi: int) -> None:
    """Print ``grid`` in the terminal and/or save it as an image."""
    from .viz import print_grid, save_grid

    if out is None and not terminal:
        raise ValueError("nothing to show: pass --out FILE.png, or drop --no-terminal")
    if terminal:
        print_grid(grid)
    if out is not None:
        Console().print(f"wrote {save_grid(grid, out, title=title, dpi=dpi)}", highlight=False)


@viz_app.command("masks")
def viz_masks(
    names: list[str] = typer.Argument(None, help="mask names: full, forward, backward, forward_strict, backward_strict, "
                                                 "causal, window:R, key_padding:L, csan1d:W, csan2d:WxN, combined "
                                                 "with & (default: one of each)"),
    length: int = typer.Option(8, "--length", "-n", help="sequence length"),
    heads: int = typer.Option(4, "--heads", help="heads of the CSAN areas"),
    query: int = typer.Option(None, "--query", help="query position of the CSAN areas (default: the middle one)"),
    head: int = typer.Option(None, "--head", help="query head of the CSAN areas (default: the middle one)"),
    head_edges: str = typer.Option("truncate", "--head-edges", help="CSAN 2D areas at the first/last head: "
                                                                    "truncate (paper) or circular"),
    checkpoint: Path = typer.Option(None, "--checkpoint", "-k",
                                    help="with --sentence: MAN Fig. 1 (SAN, the model's DMAN mask per head, FFN)"),
    sentence: str = typer.Option(None, "--sentence", "-s", help="the sentence for the DMAN masks of --checkpoint"),
    layer: int = typer.Option(1, "--layer", "-l", help="encoder layer (1-based) of the DMAN masks"),
    out: Path = typer.Option(None, "--out", "-o", help="image file (.png, .svg, .pdf)"),
    dpi: int = typer.Option(110, "--dpi", min=20, help="image resolution"),
    terminal: bool = typer.Option(True, "--terminal/--no-terminal", help="print the shaded view"),
    device: str = typer.Option("cpu", "--device"),
    max_length: int = typer.Option(None, "--max-length", min=1, help=_MAX_LENGTH_HELP),
):
    """Draw masks: maskattn.masks and CSAN areas for a length, or MAN's masks (Fig. 1) for a sentence.

    Without --checkpoint: the named masks for --length positions (rows = queries, 1 = attend) and CSAN Fig. 1's
    local areas (heads × positions). With --checkpoint and --sentence: SAN's all-ones mask, the model's DMAN mask
    of each head in --layer, and FFN's identity mask.
    """
    from . import viz
    from .viz.sources import MAX_LENGTH, check_length

    limit = max_length or MAX_LENGTH
    with _user_errors():
        if checkpoint is not None or sentence is not None:
            if checkpoint is None or sentence is None:
                raise ValueError("MAN masks need both --checkpoint and --sentence")
            if names:
                raise ValueError("give mask names or --checkpoint/--sentence, not both")
            grid, title = viz.man_mask_grid(_sentence_maps(checkpoint, sentence, device, limit), layer), \
                "MAN Fig. 1: SAN, DMAN and FFN masks"
        else:
            check_length(length, limit, "--length")
            specs = names or ["forward", "backward", "forward_strict", "backward_strict", "causal", "full",
                              "window:2", f"key_padding:{max(1, length - 2)}", "csan1d:3", "csan2d:3x3"]
            panels = viz.mask_panels(specs, length, num_heads=heads, query=query, head=head, head_edges=head_edges)
            grid = [panels[i:i + 5] for i in range(0, len(panels), 5)]  # five panels per row
            title = f"masks, length {length}"
        _show(grid, out, terminal, title, dpi)


def _sentence_maps(checkpoint: Path, sentence: str, device: str, max_length: int):
    """:func:`maskattn.viz.sentence_maps` of a sentence of at most ``max_length`` positions; its words are
    counted before the checkpoint is loaded (a sentence has at least as many positions as words)."""
    from . import viz
    from .viz.sources import check_length

    check_length(len(sentence.split()), max_length, "the sentence")
    return viz.sentence_maps(viz.load_for_maps(checkpoint, device=device, max_length=max_length), sentence)


@viz_app.command("attention")
def viz_attention(
    sentence: str = typer.Argument(..., help="the sentence, tokenised as in training"),
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    layers: list[int] = typer.Option(None, "--layer", "-l", help="encoder layer, 1-based (repeatable; default all)"),
    mechanism: str = typer.Option(None, "--mechanism", "-m",
                                  help="only this mechanism (mtsa, dman, san, csan2d, …) or 'pool' (sentence pooling)"),
    out: Path = typer.Option(None, "--out", "-o", help="image file (.png, .svg, .pdf)"),
    dpi: int = typer.Option(110, "--dpi", min=20, help="image resolution"),
    terminal: bool = typer.Option(True, "--terminal/--no-terminal", help="print the shaded view"),
    device: str = typer.Option("cpu", "--device"),
    max_length: int = typer.Option(None, "--max-length", min=1, help=_MAX_LENGTH_HELP),
):
    """Attention heatmaps of a trained model for one sentence.

    MTSA / Fast-DiSA: token2token per head (forward and backward heads) and source2token per token (MTSA Fig. 3);
    DMAN: its mask and attention per head; every other mechanism: its attention per head.
    """
    from . import viz
    from .viz.sources import MAX_LENGTH

    with _user_errors():
        maps = _sentence_maps(checkpoint, sentence, device, max_length or MAX_LENGTH)
        grid = viz.attention_grid(maps, layers or None, mechanism)
        if maps.unknown:
            Console().print("note: not in the vocabulary (read as <unk>): "
                            + " ".join(maps.tokens[i] for i in maps.unknown), highlight=False)
        _show(grid, out, terminal, f"{checkpoint.parent.name}/{checkpoint.name}: {' '.join(maps.tokens)}", dpi)


@viz_app.command("localness")
def viz_localness(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a checkpoint with DMAN sublayers"),
    data: Path = typer.Option(..., "--data", help="dataset file (e.g. the test split)"),
    san_checkpoint: Path = typer.Option(None, "--san-checkpoint",
                                        help="take the SAN rows from this model (default: --checkpoint's SAN sublayers)"),
    windows: list[int] = typer.Option(None, "--window", "-w", help="window w of Eq. 13 (repeatable; default 1 2 4)"),
    layers: list[int] = typer.Option(None, "--layer", "-l", help="encoder layer, 1-based (repeatable; default all)"),
    format: str = typer.Option(None, "--format", help="tsv, trec, trec_fine, nli, conll, lines (default: the "
                               "checkpoint's format; lines for translation checkpoints)"),
    csv_path: Path = typer.Option(None, "--csv", help="write the table as CSV"),
    json_path: Path = typer.Option(None, "--json", help="write the table as JSON"),
    batch_size: int = typer.Option(32, "--batch-size"),
    device: str = typer.Option("cpu", "--device"),
):
    """MAN Table 5: attention DMAN and SAN put within distance w of each query (Eq. 13, in percent).

    The DMAN rows come from --checkpoint, the SAN rows from its own SAN sublayers or from --san-checkpoint.
    """
    from .viz import localness_table
    from .viz.localness import WINDOWS

    with _user_errors():
        table = localness_table(checkpoint, data, san_checkpoint=san_checkpoint, windows=windows or WINDOWS,
                                layers=layers or None, format=format, batch_size=batch_size, device=device)
        Console().print(table.summary(), highlight=False)
        Console().print(table.rich_table())
        for path, write in ((csv_path, table.write_csv), (json_path, table.write_json)):
            if path is not None:
                Console().print(f"wrote {write(path)}", highlight=False)


@app.command()
def bench(
    quick: bool = typer.Option(False, "--quick", help="small preset: lengths 32,64,128,256, batch 4, width 64, 4 heads, "
                                                      "2 repeats (under a minute on 2 CPU cores); other options override it"),
    preset: str = typer.Option(None, "--preset", "-p", help="named settings behind the docs' tables: quick, mtsa "
                                                            "(MTSA Fig. 1), man (DMAN vs SAN), csan (banded vs dense), "
                                                            "gpu (the GPU acceptance run); other options override it"),
    mode: str = typer.Option(None, "--mode", help="train (forward + backward, default) or inference (forward, no_grad)"),
    compile: bool = typer.Option(None, "--compile/--eager", help="run the modules through torch.compile(fullgraph=True) "
                                                                 "(compilation happens in the untimed warm-up)"),
    lengths: str = typer.Option(None, "--lengths", "-n", help="comma-separated sequence lengths (default 64,128,256,512,1024)"),
    batch: int = typer.Option(None, "--batch", "-b", help="batch size (default 8)"),
    width: int = typer.Option(None, "--width", "-d", help="d_model (default 256)"),
    heads: int = typer.Option(None, "--heads", help="attention heads (default 4)"),
    dtype: str = typer.Option(None, "--dtype", help="float32, float64 or bfloat16 (default float32)"),
    mechanisms: str = typer.Option(None, "--mechanisms", "-m",
                                   help="comma-separated registered mechanisms and baselines (torch_mha, bilstm, "
                                        "multi_cnn, mtsa_algorithm1; default all)"),
    backends: str = typer.Option(None, "--backends",
                                 help="comma-separated backends of the registered mechanisms (default: all that "
                                      "can train on the device)"),
    repeats: int = typer.Option(None, "--repeats", "-r", help="timed forward and backward runs per point (default 5)"),
    warmup: int = typer.Option(None, "--warmup", help="untimed training steps per point first (default 1)"),
    device: str = typer.Option(None, "--device", help="auto (the CPU, plus CUDA when present), cpu or cuda (default auto)"),
    mem_budget_gb: float = typer.Option(None, "--mem-budget-gb",
                                        help="skip points estimated above this many GiB (default: half the available memory)"),
    out: Path = typer.Option(Path("bench-out"), "--out", "-o", help="folder for bench.csv, bench.json, bench.png"),
):
    """Time (forward and backward separately) and peak memory of every mechanism × backend and the baselines
    against sequence length, with FLOPs and the fraction of this machine's matmul rate (docs/bench.md).
    Exit code 1 when a point failed with an error (outputs are still written), 2 for invalid options."""
    from .bench import (BenchSettings, output_folder, parse_lengths, parse_names, render_tables, run_benchmark,
                        write_csv, write_json, write_outputs)

    console = Console()
    if not console.is_terminal:  # a file or pipe has no width limit: keep the table's rows on one line each
        console = Console(width=160)
    with _user_errors():
        given = {key: value for key, value in dict(batch=batch, width=width, heads=heads, dtype=dtype,
                                                   repeats=repeats, warmup=warmup, device=device,
                                                   mem_budget_gb=mem_budget_gb, mode=mode,
                                                   compile=compile).items() if value is not None}
        if lengths is not None:
            given["lengths"] = parse_lengths(lengths)
        if mechanisms is not None:
            given["mechanisms"] = parse_names(mechanisms, "mechanisms")
        if backends is not None:
            given["backends"] = parse_names(backends, "backends")
        if quick and preset not in (None, "quick"):
            raise ValueError(f"give either --quick or --preset {preset}, not both")
        preset = "quick" if quick else preset
        settings = BenchSettings.preset(preset, **given) if preset else BenchSettings(**given)
        folder = output_folder(out)  # a stopped run keeps the lengths it finished (bench.csv, bench.json)
        result = run_benchmark(settings, log=lambda line: console.print(escape(line), highlight=False),
                               on_length=lambda partial: (write_csv(partial, folder / "bench.csv"),
                                                          write_json(partial, folder / "bench.json")))
        paths = write_outputs(result, out)
    for table in render_tables(result):
        console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in paths.values())} ({result.wall_s:.1f} s)", highlight=False)
    failed = [r for r in result.records if r["status"] == "failed"]
    if failed:
        Console(stderr=True).print(f"[red]error:[/red] {len(failed)} point(s) failed, e.g. {failed[0]['label']} "
                                   f"n={failed[0]['n']}: {escape(failed[0]['reason'])}", markup=True, highlight=False)
        raise typer.Exit(code=1)


if __name__ == "__main__":  # pragma: no cover
    app()
