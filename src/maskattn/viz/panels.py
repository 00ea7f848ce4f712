"""What the viz commands draw, as plain numbers: :class:`Heatmap` panels built from mask definitions and
from the attention maps of a trained model. Drawing (:mod:`.draw`, :mod:`.terminal`) only renders these
panels, so a test can check every number of a plot against the library.

Panels follow the papers' figures:

* masks of :mod:`maskattn.masks` for a length ``n`` (rows = queries, columns = keys, 1 = attend);
* CSAN Fig. 1 (b)/(c): the local area of one query as a heads × positions grid (1D: a window in the
  query's own head; 2D: the same window over the ``N + 1`` neighbouring heads);
* MAN Fig. 1: the mask matrices of (a) SAN (all ones, Eq. 8), (b) DMAN (the model's dynamic mask of
  Eq. 12 for a sentence, one per head) and (c) FFN (identity, Eq. 9), shaded black (1) to white (0);
* MTSA Fig. 3: token2token maps per head (forward and backward heads) and the source2token scores at
  token level (the feature-wise probabilities averaged over features) for every head.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ArgumentError
from .. import masks as M
from ..validation import describe
from ..attention import MTSA, ConvSelfAttention, DiSA, DynamicMaskAttention, FastDiSA, StaticMaskAttention
from ..functional.local import HEAD_EDGES, check_head_window, check_window
from .maps import SentenceMaps, Sublayer

__all__ = ["Heatmap", "Grid", "MASK_SPECS", "mask_panel", "mask_panels", "csan_area", "man_mask_grid",
           "attention_grid", "sublayer_rows", "head_mask_names"]

#: The mask names :func:`mask_panel` understands (``&`` intersects two of them, e.g. ``forward&window:2``).
MASK_SPECS = (*M.MASK_NAMES, "window:R", "key_padding:L", "csan1d:W", "csan2d:WxN")

MASK_CMAP, ATTENTION_CMAP = "Greys", "viridis"


@dataclass(frozen=True)
class Heatmap:
    """One matrix to draw: ``values`` (rows × columns, float, on the CPU) with its row and column labels,
    axis names, a colour range and a matplotlib colour map name."""

    title: str
    values: torch.Tensor
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    ylabel: str = "query"
    xlabel: str = "key"
    vmin: float = 0.0
    vmax: float = 1.0
    cmap: str = MASK_CMAP
    highlight: tuple[int, int] | None = None  # (row, column) of a cell to outline, e.g. CSAN's query

    def __post_init__(self):
        if not isinstance(self.values, torch.Tensor) or self.values.dim() != 2:
            raise ArgumentError(f"Heatmap values must be a 2-D tensor (rows, columns), got {describe(self.values)}")
        rows, cols = self.values.shape
        if self.highlight is not None and not (0 <= self.highlight[0] < rows and 0 <= self.highlight[1] < cols):
            raise ArgumentError(f"Heatmap {self.title!r}: highlight {self.highlight} is outside the {rows} × {cols} values")
        if len(self.row_labels) != rows or len(self.col_labels) != cols:
            raise ArgumentError(f"Heatmap {self.title!r}: {len(self.row_labels)} row labels and {len(self.col_labels)} "
                             f"column labels for values of shape {(rows, cols)}")
        if not self.vmax > self.vmin:
            raise ArgumentError(f"Heatmap {self.title!r}: vmax ({self.vmax}) must be greater than vmin ({self.vmin})")


#: Rows of panels, drawn top to bottom (a row per sublayer, as the rows of MTSA Fig. 3).
Grid = list[list[Heatmap]]


def _attention_panel(title: str, values: torch.Tensor, rows: Sequence[str], cols: Sequence[str], *,
                     ylabel: str = "query", xlabel: str = "key") -> Heatmap:
    """An attention map, coloured from 0 to its largest weight (long rows spread thin weights)."""
    values = values.detach().float().cpu()
    vmax = float(values.max()) if values.numel() and float(values.max()) > 0 else 1.0
    return Heatmap(title, values, tuple(rows), tuple(cols), ylabel, xlabel, 0.0, vmax, ATTENTION_CMAP)


def _mask_panel(title: str, values: torch.Tensor, rows: Sequence[str], cols: Sequence[str], *,
                ylabel: str = "query", xlabel: str = "key", highlight: tuple[int, int] | None = None) -> Heatmap:
    """A mask in ``[0, 1]``, shaded black (1) to white (0) as in MAN Fig. 1."""
    return Heatmap(title, values.detach().float().cpu(), tuple(rows), tuple(cols), ylabel, xlabel, 0.0, 1.0,
                   MASK_CMAP, highlight)


# --------------------------------------------------------------------------------------------------
# masks of maskattn.masks and CSAN areas
# --------------------------------------------------------------------------------------------------

def _check_length(length) -> int:
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ArgumentError(f"length must be an int >= 1 (the number of positions), got {describe(length)}")
    return length


def _spec_int(spec: str, text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ArgumentError(f"mask {spec!r}: {what} must be an integer >= 0, got {text!r}")
    return value


def _one_mask(spec: str, length: int) -> M.Mask:
    """A :class:`~maskattn.masks.Mask` from one name of :data:`MASK_SPECS` (not CSAN)."""
    if spec in M.MASK_NAMES or spec.startswith("window:"):
        return M.from_name(spec)
    if spec.startswith("key_padding:"):
        real = _spec_int(spec, spec.split(":", 1)[1], "the number of real tokens L")
        if not 1 <= real <= length:
            raise ArgumentError(f"mask {spec!r}: L (real tokens before the padding) must be in 1..{length} for length "
                             f"{length}")
        return M.key_padding(torch.arange(length)[None, :] >= real)  # (1, n), True = padding
    raise ArgumentError(f"unknown mask {spec!r}; expected one of {', '.join(MASK_SPECS)} (combine with '&', "
                     "e.g. 'forward&window:2')")


def mask_panel(spec: str, length: int, *, num_heads: int = 4, query: int | None = None,
               head: int | None = None, head_edges: str = "truncate") -> Heatmap:
    """The panel of one mask name of :data:`MASK_SPECS` for ``length`` positions.

    * masks of :mod:`maskattn.masks` (``forward``, ``backward_strict``, ``window:2``, ``key_padding:5``,
      ``forward&window:2``, …): the ``length × length`` materialisation (rows = queries, 1 = attend);
    * ``csan1d:W`` / ``csan2d:WxN``: CSAN Fig. 1's local area of one query, ``num_heads × length``
      (see :func:`csan_area`; ``query`` and ``head`` default to the middle ones).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ArgumentError(f"mask name must be a non-empty string, one of {', '.join(MASK_SPECS)}; got {describe(spec)}")
    spec = spec.strip()
    n = _check_length(length)
    positions = [str(i) for i in range(n)]
    if spec.startswith(("csan1d:", "csan2d:")):
        kind, size = spec.split(":", 1)
        if kind == "csan1d":
            window, head_window = _spec_int(spec, size, "the window W"), 1
        else:
            parts = size.lower().split("x")
            if len(parts) != 2:
                raise ArgumentError(f"mask {spec!r}: expected 'csan2d:WxN' (window W positions × N heads, e.g. 3x3)")
            window, head_window = (_spec_int(spec, p, what) for p, what in zip(parts, ("the window W", "the heads N")))
        area = csan_area(n, num_heads, window=window, head_window=head_window, query=query, head=head,
                         head_edges=head_edges)
        q = n // 2 if query is None else query
        h = num_heads // 2 if head is None else head
        label = f"CSAN 1D, window {window}" if head_window == 1 else f"CSAN 2D, area {window}×{head_window}"
        return _mask_panel(f"{label} (query {q}, head {h})", area, [f"head {g}" for g in range(num_heads)],
                           positions, ylabel="head", xlabel="position", highlight=(h, q))
    parts = [p.strip() for p in spec.split("&")]
    mask = _one_mask(parts[0], n)
    for part in parts[1:]:
        mask = mask & _one_mask(part, n)
    return _mask_panel(spec, M.materialize(mask, n)[0, 0], positions, positions)


def mask_panels(specs: Sequence[str], length: int, **options) -> list[Heatmap]:
    """:func:`mask_panel` for each name of ``specs`` (``options``: ``num_heads``, ``query``, ``head``,
    ``head_edges``)."""
    if isinstance(specs, str) or not isinstance(specs, Sequence) or not specs:
        raise ArgumentError(f"specs must be a non-empty list of mask names ({', '.join(MASK_SPECS)}), got "
                         f"{describe(specs)}")
    return [mask_panel(spec, length, **options) for spec in specs]


def csan_area(length: int, num_heads: int, *, window: int, head_window: int = 1, query: int | None = None,
              head: int | None = None, head_edges: str = "truncate") -> torch.Tensor:
    """The keys a CSAN query can see, as a ``(num_heads, length)`` 0/1 tensor (CSAN Fig. 1 (b), (c)).

    Query ``query`` of head ``head`` sees positions ``|query − j| <= M/2`` (``window = M + 1``, Eq. 4–5)
    of the heads ``head − N/2 … head + N/2`` (``head_window = N + 1``, Eq. 7–8; 1 = CSAN 1D), truncated
    at the first and last head (``head_edges="truncate"``, the paper) or wrapping around
    (``"circular"``). ``query`` and ``head`` default to the middle position and head.
    """
    n = _check_length(length)
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ArgumentError(f"num_heads must be an int >= 1, got {describe(num_heads)}")
    check_window(window)
    check_head_window(head_window, num_heads)
    if head_edges not in HEAD_EDGES:
        raise ArgumentError(f"head_edges must be one of {', '.join(HEAD_EDGES)}, got {head_edges!r}")
    query = n // 2 if query is None else query
    head = num_heads // 2 if head is None else head
    for name, value, limit in (("query", query, n), ("head", head, num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < limit:
            raise ArgumentError(f"{name} must be an int in 0..{limit - 1}, got {describe(value)}")
    offsets = torch.arange(head_window) - head_window // 2
    heads = head + offsets
    heads = heads % num_heads if head_edges == "circular" else heads[(heads >= 0) & (heads < num_heads)]
    positions = (torch.arange(n) - query).abs() <= window // 2  # (n,)
    area = torch.zeros(num_heads, n)
    area[heads] = positions.float()
    return area


# --------------------------------------------------------------------------------------------------
# panels from a trained model's maps
# --------------------------------------------------------------------------------------------------

def head_mask_names(module, length: int) -> list[str]:
    """The name of each head's positional mask of an MTSA / Fast-DiSA / DiSA module (``forward``,
    ``backward_strict``, ``window:2``, …; ``custom`` when no named mask matches) for ``length`` tokens."""
    heads = M.materialize(module.mask, length, heads=module.num_heads)[0]  # (H, n, n)
    candidates = [*M.MASK_NAMES, *(f"window:{r}" for r in range(length))]
    dense = {name: M.from_name(name).materialize(length)[0, 0] for name in candidates}
    return [next((name for name, d in dense.items() if torch.equal(d, h)), "custom") for h in heads]


def _per_head(title: str, what: str, maps: torch.Tensor, tokens, head_labels) -> list[Heatmap]:
    """One attention panel per head of a ``(H, n, m)`` map, titled ``title`` over ``what · head <label>``."""
    return [_attention_panel(f"{title}\n{what} · head {label}", maps[h], tokens, tokens)
            for h, label in enumerate(head_labels)]


def sublayer_rows(sub: Sublayer, tokens: Sequence[str]) -> Grid:
    """The panels of one attention sublayer (a row each; DMAN has a mask row and an attention row)."""
    module, maps, n = sub.module, sub.maps, len(tokens)
    title = f"layer {sub.layer} · {sub.name}"
    if isinstance(module, (MTSA, FastDiSA)):  # MTSA Fig. 3
        labels = [f"{h} {name}" for h, name in enumerate(head_mask_names(module, n))]
        assert maps.source2token is not None  # MTSA and Fast-DiSA return their source2token scores
        s2t = maps.source2token.mean(-1)  # (H, n, d_h) -> (H, n): token level, averaged over features
        return [_per_head(title, "token2token", maps.attention, tokens, labels)
                + [_attention_panel(f"{title}\nsource2token (token level)", s2t, labels, tokens, ylabel="head",
                                    xlabel="token")]]
    if isinstance(module, DiSA):  # feature-wise (H, n, n, d_h) probabilities, averaged over features
        labels = [f"{h} {name}" for h, name in enumerate(head_mask_names(module, n))]
        return [_per_head(title, "attention (feature mean)", maps.attention.mean(-1), tokens, labels)]
    heads = range(maps.attention.shape[0])  # (H, n, n)
    if isinstance(module, DynamicMaskAttention):  # MAN Eq. 12 mask and the attention S_M(Q, K) of Eq. 4
        assert maps.mask is not None  # DMAN and SMAN return their mask M
        return [[_mask_panel(f"{title}\nmask · head {h}", maps.mask[h], tokens, tokens) for h in heads],
                _per_head(title, "attention", maps.attention, tokens, heads)]
    if isinstance(module, StaticMaskAttention):  # MAN Eq. 11: one 0/1 mask for every head
        assert maps.mask is not None
        return [[_mask_panel(f"{title}\nmask", maps.mask[0], tokens, tokens)]
                + _per_head(title, "attention", maps.attention, tokens, heads)]
    if isinstance(module, ConvSelfAttention) and module.head_window > 1:  # (H, n, H, n): keys of every head
        H = module.num_heads
        cols = [f"{g}:{t}" for g in range(H) for t in tokens]
        return [[_attention_panel(f"{title}\nattention · head {h}", maps.attention[h].reshape(n, H * n), tokens,
                                  cols, xlabel="head:key") for h in heads]]
    return [_per_head(title, "attention", maps.attention, tokens, heads)]


def attention_grid(sentence: SentenceMaps, layers: Sequence[int] | None = None,
                   mechanism: str | None = None) -> Grid:
    """Rows of panels for the attention sublayers of ``sentence`` in ``layers`` (1-based, default all)
    whose mechanism is ``mechanism`` (default any; see :meth:`SentenceMaps.select`). ``mechanism="pool"``
    draws the sentence's source2token pooling weights at token level instead; with neither ``layers``
    nor ``mechanism`` they come last, after every layer."""
    pool = mechanism == "pool" or (mechanism is None and layers is None and sentence.pool is not None)
    grid: Grid = []
    if mechanism != "pool":
        for sub in sentence.select(layers, mechanism):
            grid += sublayer_rows(sub, sentence.tokens)
    if pool:
        if sentence.pool is None:
            raise ArgumentError("the model does not pool with source2token attention (a classifier with model.pool "
                             "'source2token' does; translation encoders never pool); there are no pooling weights "
                             "to draw")
        grid.append([_attention_panel("sentence pooling\nsource2token (token level)", sentence.pool.mean(-1)[None],
                                      ["pool"], sentence.tokens, ylabel="", xlabel="token")])
    return grid


def man_mask_grid(sentence: SentenceMaps, layer: int) -> Grid:
    """MAN Fig. 1 for ``sentence`` in encoder layer ``layer`` (1-based): (a) SAN's all-ones mask (Eq. 8),
    (b) the model's DMAN mask of Eq. 12, one panel per head, (c) FFN's identity mask (Eq. 9)."""
    subs = sentence.select(layers=[layer], mechanism="dman")
    n, tokens = len(sentence.tokens), sentence.tokens
    rows: Grid = []
    for sub in subs:
        mask = sub.maps.mask  # (H, n, n)
        assert mask is not None  # a DMAN sublayer returns its mask M
        dman = [_mask_panel(f"(b) DMAN\nlayer {layer}, head {h}", mask[h], tokens, tokens) for h in range(mask.shape[0])]
        rows.append([_mask_panel("(a) SAN", torch.ones(n, n), tokens, tokens), *dman,
                     _mask_panel("(c) FFN", torch.eye(n), tokens, tokens)])
    return rows
