"""``maskattn viz masks | attention | localness``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from ..errors import ArgumentError
from ..files import check_outputs
from .app import DEVICE_HELP, OVERWRITE_HELP, app, user_errors
from .inference import _checkpoint_file, checkpoint_inputs

_MAX_LENGTH_HELP = "the longest sentence / --length drawn, in positions (default 256; maps are n × n per head)"

viz_app = typer.Typer(help="Draw masks, attention maps of trained models (classifiers; the encoder of translation "
                           "models) and MAN's localness table (Table 5).",
                      no_args_is_help=True)
app.add_typer(viz_app, name="viz")


def _check_image(out: Path | None, overwrite: bool, inputs: list[tuple[str, Path]]) -> None:
    """Refuse an ``--out`` image that cannot or may not be written (:func:`maskattn.files.check_outputs`, and
    an image suffix), before anything is drawn."""
    from ..viz.draw import IMAGE_SUFFIXES

    if out is not None and out.suffix.lower() not in IMAGE_SUFFIXES:
        raise ArgumentError(f"--out {out}: an image file must end in one of {', '.join(IMAGE_SUFFIXES)}")
    check_outputs({"--out": out}, inputs=inputs, overwrite=overwrite)


def _show(grid, out: Path | None, terminal: bool, title: str, dpi: int) -> None:
    """Print ``grid`` in the terminal and/or save it as an image."""
    from ..viz import print_grid, save_grid

    if out is None and not terminal:
        raise ArgumentError("nothing to show: pass --out FILE.png, or drop --no-terminal")
    if terminal:
        print_grid(grid)
    if out is not None:
        Console().print(f"wrote {save_grid(grid, out, title=title, dpi=dpi)}", highlight=False)


@viz_app.command("masks")
def viz_masks(
    names: list[str] = typer.Argument(None, metavar="MASK", help="mask names: full, forward, backward, forward_strict, backward_strict, "
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
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    max_length: int = typer.Option(None, "--max-length", min=1, help=_MAX_LENGTH_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
):
    """Draw masks: maskattn.masks and CSAN areas for a length, or MAN's masks (Fig. 1) for a sentence.

    Without --checkpoint: the named masks for --length positions (rows = queries, 1 = attend) and CSAN Fig. 1's
    local areas (heads × positions). With --checkpoint and --sentence: SAN's all-ones mask, the model's DMAN mask
    of each head in --layer, and FFN's identity mask.
    """
    from .. import viz
    from ..device import check_memory
    from ..viz.sources import MAX_LENGTH, check_length

    limit = max_length or MAX_LENGTH
    with user_errors():
        if checkpoint is not None or sentence is not None:
            if checkpoint is None or sentence is None:
                raise ArgumentError("MAN masks need both --checkpoint and --sentence")
            if names:
                raise ArgumentError("give mask names or --checkpoint/--sentence, not both")
            checkpoint = _checkpoint_file(checkpoint)
            _check_image(out, overwrite, checkpoint_inputs(checkpoint))
            grid, title = viz.man_mask_grid(_sentence_maps(checkpoint, sentence, device, limit), layer), \
                "MAN Fig. 1: SAN, DMAN and FFN masks"
        else:
            _check_image(out, overwrite, [])
            check_length(length, limit, "--length")
            specs = names or ["forward", "backward", "forward_strict", "backward_strict", "causal", "full",
                              "window:2", f"key_padding:{max(1, length - 2)}", "csan1d:3", "csan2d:3x3"]
            # each panel: an n × n mask and its float64 image (a raised --max-length must not exhaust memory)
            check_memory(len(specs) * length * length * 16, what=f"{len(specs)} mask panels of {length} × {length}",
                         advice="lower --length")
            panels = viz.mask_panels(specs, length, num_heads=heads, query=query, head=head, head_edges=head_edges)
            grid = [panels[i:i + 5] for i in range(0, len(panels), 5)]  # five panels per row
            title = f"masks, length {length}"
        _show(grid, out, terminal, title, dpi)


def _sentence_maps(checkpoint: Path, sentence: str, device: str, max_length: int):
    """:func:`maskattn.viz.sentence_maps` of a sentence of at most ``max_length`` positions; its words are
    counted before the checkpoint is loaded (a sentence has at least as many positions as words)."""
    from .. import viz
    from ..viz.sources import check_length

    check_length(len(sentence.split()), max_length, "the sentence")
    source = viz.load_for_maps(checkpoint, device=device, max_length=max_length)
    return viz.sentence_maps(source, sentence)


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
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    max_length: int = typer.Option(None, "--max-length", min=1, help=_MAX_LENGTH_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
):
    """Attention heatmaps of a trained model for one sentence.

    MTSA / Fast-DiSA: token2token per head (forward and backward heads) and source2token per token (MTSA Fig. 3);
    DMAN: its mask and attention per head; every other mechanism: its attention per head.
    """
    from .. import viz
    from ..viz.sources import MAX_LENGTH

    with user_errors():
        checkpoint = _checkpoint_file(checkpoint)
        _check_image(out, overwrite, checkpoint_inputs(checkpoint))
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
    data_format: str = typer.Option(None, "--format", help="tsv, trec, trec_fine, nli, conll, lines (default: the "
                               "checkpoint's format; lines for translation checkpoints)"),
    csv_path: Path = typer.Option(None, "--csv", help="write the table as CSV"),
    json_path: Path = typer.Option(None, "--json", help="write the table as JSON"),
    batch_size: int = typer.Option(32, "--batch-size"),
    device: str = typer.Option("auto", "--device", help=DEVICE_HELP),
    overwrite: bool = typer.Option(False, "--overwrite", help=OVERWRITE_HELP),
):
    """MAN Table 5: attention DMAN and SAN put within distance w of each query (Eq. 13, in percent).

    The DMAN rows come from --checkpoint, the SAN rows from its own SAN sublayers or from --san-checkpoint.
    """
    from ..viz import localness_table
    from ..viz.localness import WINDOWS

    with user_errors():
        checkpoint = _checkpoint_file(checkpoint)
        san_checkpoint = None if san_checkpoint is None else _checkpoint_file(san_checkpoint)
        check_outputs({"--csv": csv_path, "--json": json_path}, overwrite=overwrite,
                      inputs=[*checkpoint_inputs(checkpoint), ("the --data file", data),
                              *(checkpoint_inputs(san_checkpoint, "--san-checkpoint") if san_checkpoint else [])])
        table = localness_table(checkpoint, data, windows=windows or WINDOWS, san_checkpoint=san_checkpoint,
                                layers=layers or None, format=data_format, batch_size=batch_size, device=device)
        Console().print(table.summary(), highlight=False)
        Console().print(table.rich_table())
        for path, write in ((csv_path, table.write_csv), (json_path, table.write_json)):
            if path is not None:
                Console().print(f"wrote {write(path)}", highlight=False)
