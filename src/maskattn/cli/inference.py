"""``maskattn eval``, ``predict``, ``generate`` (alias ``translate``): using a trained checkpoint."""

from __future__ import annotations

import functools
import inspect
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import ArgumentError
from ..files import check_outputs
from .app import DEVICE_HELP, OVERWRITE_HELP, app, user_errors, warn

# the decoding flags of `generate` and `eval` (fairseq-generate's names); unset, the checkpoint's own settings hold
_FROM_RUN = "(default: the checkpoint's run setting)"
DECODING_FLAGS = {
    "beam": (int, typer.Option(None, "--beam", help=f"beam size, 1 = greedy {_FROM_RUN}")),
    "length_penalty": (float, typer.Option(None, "--length-penalty", "--lenpen",
                                           help=f"length penalty α of beam search {_FROM_RUN}")),
    "length_penalty_kind": (str, typer.Option(None, "--length-penalty-kind",
                                              help=f"gnmt: ((5+|Y|)/6)^α; fairseq: |Y|^α {_FROM_RUN}")),
    "min_len": (int, typer.Option(None, "--min-len", help=f"at least this many output tokens before EOS {_FROM_RUN}")),
    "max_len": (int, typer.Option(None, "--max-len", help=f"at most this many output tokens before EOS {_FROM_RUN}")),
    "no_repeat_ngram_size": (int, typer.Option(None, "--no-repeat-ngram-size",
                                               help=f"no n-gram of this size twice in an output, 0 = off {_FROM_RUN}")),
}


def with_decoding_flags(command: Callable) -> Callable:
    """``command`` with the :data:`DECODING_FLAGS` added to its options; it receives the flags that were given as
    one dict, ``decoding`` (:meth:`DecodingOptions.replace` of the checkpoint's settings)."""
    signature = inspect.signature(command)
    flags = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
             for name, (kind, option) in DECODING_FLAGS.items()]

    @functools.wraps(command)
    def run(**kwargs):
        decoding = {name: value for name in DECODING_FLAGS if (value := kwargs.pop(name)) is not None}
        return command(**kwargs, decoding=decoding)

    kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values() if p.name != "decoding"]
    run.__signature__ = signature.replace(parameters=kept + flags)  # type: ignore[attr-defined]  # what typer reads
    return run


@app.command("eval")
@with_decoding_flags
def eval_(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    data: Path = typer.Option(None, "--data", help="classifiers: labelled file to evaluate on"),
    data_format: str = typer.Option(None, "--format", help="tsv, trec, trec_fine, nli, conll (default: the checkpoint's)"),
    src: Path = typer.Option(None, "--src", help="seq2seq: source sentences (articles), one per line"),
    ref: Path = typer.Option(None, "--ref", help="seq2seq: references (translations, summaries), line-aligned "
                             "with --src"),
    batch_size: int = typer.Option(64, "--batch-size", help="seq2seq: sentences per decoding batch"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    predictions: Path = typer.Option(None, "--predictions", help="also write what was scored to this file: a "
                                     "classifier's predicted and gold label per example (JSON lines, as a run's "
                                     "test.pred.jsonl), a seq2seq model's outputs (one per line, as test.hyp.txt)"),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    decoding: dict | None = None,
):
    """Evaluate a checkpoint; prints the metrics as JSON. Classifiers: --data FILE. Seq2seq models: --src FILE
    --ref FILE, decoded with the checkpoint's own decoding settings unless flags change them; translation is
    scored by sacreBLEU BLEU and chrF (with their signatures), summarization by ROUGE-1/2/L F1 (rouge-score,
    with 95 % bootstrap intervals). Inputs longer than the model reads are truncated, with a warning listing
    their lines. --predictions FILE keeps the per-example outputs, so that `maskattn grid compare` can pair two
    models item by item."""
    from ..inference import evaluate_file, evaluate_translation

    with user_errors():
        checkpoint = _checkpoint_file(checkpoint)
        check_outputs({"--predictions": predictions}, overwrite=overwrite,
                      inputs=[*checkpoint_inputs(checkpoint), ("the --data file", data), ("the --src file", src),
                              ("the --ref file", ref)])
        if src is not None or ref is not None:
            if src is None or ref is None or data is not None:
                raise ArgumentError("seq2seq evaluation takes both --src FILE and --ref FILE (and no --data)")
            with _decoding_progress() as progress:
                metrics = evaluate_translation(checkpoint, src, ref, batch_size=batch_size, device=device,
                                               on_truncate=_warn_truncated("subwords"), progress=progress,
                                               predictions=predictions, **(decoding or {}))
        elif data is None:
            raise ArgumentError("nothing to evaluate: pass --data FILE (classifiers) or --src FILE --ref FILE "
                             "(seq2seq: translation, summarization)")
        else:
            metrics = evaluate_file(checkpoint, data, format=data_format, device=device,
                                    on_truncate=_warn_truncated("tokens"), predictions=predictions)
    Console().print_json(json.dumps(_finite_json(metrics, checkpoint), allow_nan=False))


def _finite_json(value, checkpoint: Path, key: str = ""):
    """``value`` with every non-finite number replaced by null (JSON has no NaN: ``"loss": NaN`` is not JSON), each
    with a warning naming it — a checkpoint whose weights are not finite gives such metrics."""
    if isinstance(value, dict):
        return {k: _finite_json(v, checkpoint, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_json(v, checkpoint, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        warn(f"{key} is {value} (are the weights of {checkpoint} finite?); printed as null")
        return None
    return value


def _warn_truncated(unit: str, where: Callable[[list[int]], list[str]] | None = None
                    ) -> Callable[[list[int], int], None]:
    """The ``on_truncate`` of the inference functions: say on stderr which inputs were cut to the model's limit
    of ``unit``. ``where`` names the inputs by their source (the default: ``line(s) N, …`` of the one file)."""
    def warn(lines: list[int], limit: int) -> None:
        shown = "; ".join(where(lines) if where is not None else [f"line(s) {_numbers(lines)}"])
        Console(stderr=True).print(f"[yellow]warning:[/yellow] {len(lines)} input line(s) longer than the model's "
                                   f"max_len were truncated to fit (the first {limit} {unit}): {shown}",
                                   markup=True, highlight=False, soft_wrap=True)
    return warn


def _numbers(numbers: list[int]) -> str:
    """The first ten of ``numbers``, comma-separated (``…`` when there are more)."""
    return ", ".join(map(str, numbers[:10])) + (", …" if len(numbers) > 10 else "")


def _by_source(arguments: int, input_file: Path | None) -> Callable[[list[int]], list[str]]:
    """Names of 1-based input numbers when the inputs are ``arguments`` positional arguments followed by the lines
    of ``input_file``: the file's lines by their line numbers, then the arguments by their position."""
    def where(numbers: list[int]) -> list[str]:
        lines = [n - arguments for n in numbers if n > arguments]
        args = [n for n in numbers if n <= arguments]
        return ([f"{input_file} line(s) {_numbers(lines)}"] if lines else []) + \
            ([f"argument(s) {_numbers(args)}"] if args else [])
    return where


def _checkpoint_file(path: Path) -> Path:
    """A checkpoint path as given, or for a run folder its ``best.safetensors`` (a note says so); a folder without
    one raises :class:`CheckpointError` naming the checkpoints it holds."""
    from ..checkpoint import checkpoint_in_folder

    if not path.is_dir():
        return path
    chosen = checkpoint_in_folder(path)
    Console(stderr=True).print(f"note: {path} is a folder; using {chosen}", highlight=False, markup=False,
                               soft_wrap=True)  # one line: a long path can be pasted
    return chosen


def checkpoint_inputs(checkpoint: Path, option: str = "--checkpoint") -> list[tuple[str, Path]]:
    """What a command reading ``checkpoint`` reads, for :func:`~maskattn.files.check_outputs`: the checkpoint, and
    the files of the run in its folder (its other checkpoint, log, configuration, manifest), which an output may
    not replace either."""
    from ..train.run_folder import RunFolder

    return [(f"the {option} file", checkpoint)] + \
        [(f"a file of the run in {checkpoint.parent}", path) for path in RunFolder(checkpoint.parent).run_files()]


def _input_lines(path: Path | None) -> list[str]:
    """The lines of ``path``, or of stdin when it is ``None`` or ``-`` (:mod:`maskattn.data.text`)."""
    from ..data.text import read_lines, read_stream_lines

    if path is None or str(path) == "-":
        return read_stream_lines(typer.get_binary_stream("stdin"))
    return read_lines(path)


@with_decoding_flags
def generate(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a seq2seq .safetensors checkpoint (translation, "
                                    "summarization)"),
    input_file: Path = typer.Option(None, "--input", "-i", help="source sentences (articles), one per line "
                                    "(default, or -: stdin)"),
    output: Path = typer.Option(None, "--output", "-o", help="write the outputs here (default: stdout)"),
    batch_size: int = typer.Option(64, "--batch-size", help="sentences per decoding batch"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
    decoding: dict | None = None,
):
    """Translate or summarise text with a seq2seq checkpoint, one input per line: one output line per input line
    (an empty line stays empty; a line longer than the model's max_len is truncated, with a warning on stderr).
    Decodes with the checkpoint's own settings (beam, length penalty, length limits, n-gram blocking) unless
    flags change them."""
    from ..files import atomic_write
    from ..inference import load_translator

    with user_errors():
        checkpoint = _checkpoint_file(checkpoint)
        check_outputs({"--output": output}, inputs=[*checkpoint_inputs(checkpoint), ("the --input file", input_file)],
                      overwrite=overwrite)
        lines = _input_lines(input_file)
        translator = load_translator(checkpoint, device=device)
        with _decoding_progress() as progress:
            outputs = translator.translate(lines, batch_size=batch_size, on_truncate=_warn_truncated("subwords"),
                                           progress=progress, **(decoding or {}))
        text = "".join(line + "\n" for line in outputs)
        if output is not None:
            atomic_write(output, [text.encode("utf-8")])
    if output is None:
        typer.echo(text, nl=False)


app.command("generate")(generate)
app.command("translate", help="The same command as `maskattn generate` (its name before summarization models "
            "existed).")(generate)


@contextmanager
def _decoding_progress() -> Iterator[Callable[[int, int], None]]:
    """A transient progress bar on stderr (shown on a terminal only) for decoding: ``progress(done, total)``."""
    console = Console(stderr=True)
    with Progress(TextColumn("decoding"), BarColumn(), MofNCompleteColumn(), TextColumn("sentences"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as bar:
        task = bar.add_task("decode", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


@app.command()
def predict(
    checkpoint: Path = typer.Option(..., "--checkpoint", "-k", help="a .safetensors checkpoint"),
    texts: list[str] = typer.Argument(None, metavar="SENTENCE", help="sentences (pair models: 'premise ||| hypothesis')"),
    input_file: Path = typer.Option(None, "--input", "-i", help="file with one sentence per line (-: stdin)"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
):
    """Predict labels: one output line per input (the arguments, then the lines of --input), the label or a
    tagger's tags; a blank input line gives a blank output line. Inputs longer than the model reads are
    truncated, with a warning listing them."""
    from ..inference import predict as run_predict

    with user_errors():
        lines = list(texts or []) + (_input_lines(input_file) if input_file is not None else [])
        if not texts and input_file is None:
            raise ArgumentError("no input: pass sentences as arguments or --input FILE")
        labels = run_predict(_checkpoint_file(checkpoint), lines, device=device,
                             on_truncate=_warn_truncated("tokens", _by_source(len(texts or []), input_file)))
    for label in labels:
        typer.echo(" ".join(label) if isinstance(label, list) else label)
