"""Visualisation (``maskattn viz``): masks, attention heatmaps of trained models, and MAN's localness table.

The numbers and the drawing are separate: :mod:`.panels` turns masks and a model's maps into
:class:`Heatmap` panels (plain tensors with labels), :mod:`.sources` adapts a checkpoint (classifier or
translation) into encoded sentences and per-layer encoder maps, :mod:`.maps` reads those maps for a sentence,
:mod:`.localness` computes MAN Table 5; :mod:`.draw` renders panels with matplotlib (Agg) and
:mod:`.terminal` as shaded text.

Example::

    >>> from maskattn import viz
    >>> panel = viz.mask_panel("forward&window:1", 4)
    >>> panel.values
    tensor([[1., 0., 0., 0.],
            [1., 1., 0., 0.],
            [0., 1., 1., 0.],
            [0., 0., 1., 1.]])
"""

from .draw import draw_grid, save_grid
from .localness import LocalnessTable, localness_table, localness_values
from .maps import SentenceMaps, Sublayer, mechanism_names, sentence_maps
from .panels import (
    MASK_SPECS,
    Grid,
    Heatmap,
    attention_grid,
    csan_area,
    head_mask_names,
    man_mask_grid,
    mask_panel,
    mask_panels,
    sublayer_rows,
)
from .sources import ClassifierSource, EncodedFile, EncodedSentence, MapSource, TranslationSource, load_for_maps
from .terminal import panel_text, print_grid

__all__ = [
    "Heatmap", "Grid", "MASK_SPECS", "mask_panel", "mask_panels", "csan_area", "man_mask_grid", "attention_grid",
    "sublayer_rows", "head_mask_names", "SentenceMaps", "Sublayer", "sentence_maps", "load_for_maps",
    "mechanism_names", "LocalnessTable", "localness_table", "localness_values", "MapSource", "ClassifierSource",
    "TranslationSource", "EncodedSentence", "EncodedFile", "draw_grid", "save_grid", "panel_text",
    "print_grid",
]
