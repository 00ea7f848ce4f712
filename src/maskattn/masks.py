"""Positional masks as FlexAttention-style predicates.

A :class:`Mask` wraps a pure function ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (the signature of
``torch.nn.attention.flex_attention``'s ``mask_mod``). ``True`` means *attend*; rows are queries,
columns are keys. Masks compose with ``&``, ``|`` and ``~`` and can be materialised to a dense bool
tensor with :meth:`Mask.materialize` (or :func:`materialize`).

The directional masks follow DiSA / MTSA §2.2: with query ``i`` and key ``j``,

* ``forward_mask``  attends to keys ``j < i`` (``j <= i`` with the diagonal included),
* ``backward_mask`` attends to keys ``j > i`` (``j >= i`` with the diagonal included).

Every positional structure of the library is defined here once: the directional masks, the causal
mask of decoders, the band ``i − left <= j <= i + right`` (a local window, CSAN / SMAN / MTSA window
heads), a per-sequence window (SMAN's ``b = sqrt(L)/2``) and key padding. Incremental decoding
evaluates a mask for queries at absolute positions ``offset …`` with :meth:`Mask.shifted`.
:func:`allowed` combines a mask with a key-padding mask into the dense tensor the dense kernels take.

Example::

    >>> from maskattn import masks
    >>> m = masks.forward_mask() & masks.window(2)
    >>> m.materialize(5).int()[0, 0]
    tensor([[1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [0, 1, 1, 1, 0],
            [0, 0, 1, 1, 1]], dtype=torch.int32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import math

import torch

from .errors import ArgumentError, ArgumentTypeError, warn_renamed
from .validation import check_bool, check_nonnegative_int, describe

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

#: farther than any position (a band side beyond it is the same predicate), with room in int64 for an offset
_FAR = 2**61

__all__ = [
    "Mask",
    "MaskMod",
    "full",
    "forward_mask",
    "backward_mask",
    "forward",
    "backward",
    "causal",
    "band",
    "window",
    "sequence_window",
    "key_padding",
    "per_head",
    "from_name",
    "MASK_NAMES",
    "materialize",
    "as_dense",
    "allowed",
    "predicate",
]


class Mask:
    """A boolean attention mask given as a predicate over ``(b, h, q_idx, kv_idx)``.

    ``mask_mod`` must be built from tensor operations only (comparisons, ``&``, ``|``, indexing of
    captured tensors), so that it runs unchanged inside FlexAttention's ``vmap``.
    ``static`` is ``True`` when the predicate ignores ``b`` (it depends on positions and heads
    only), which lets callers materialise it once with a broadcast batch dimension.
    """

    def __init__(self, mask_mod: MaskMod, name: str, *, static: bool = True,
                 band: tuple[float, float] | None = None, head_bands: tuple[tuple[float, float], ...] | None = None,
                 cache_key=None):
        if not callable(mask_mod):
            raise ArgumentTypeError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool, got {type(mask_mod).__name__}")
        self.mask_mod = mask_mod
        self.name = name
        self.static = static
        #: ``(left, right)`` when the mask is exactly the band ``i − left <= j <= i + right`` on every
        #: head (``inf`` for an open side), else None. Finite bands run on the O(n·band) local path.
        self.band = band
        #: ``((left, right), …)`` one band per head when head ``c`` is exactly the band of entry ``c`` (MTSA's
        #: multi-mask: forward, backward, window heads), else None; see :meth:`bands_per_head`
        self.head_bands = head_bands
        #: a hashable key that identifies the predicate (two masks with one key are the same function), so
        #: its FlexAttention block mask can be reused; None for predicates given as bare functions
        self.cache_key = cache_key

    @property
    def finite_band(self) -> tuple[int, int] | None:
        """``(left, right)`` as ints when the mask is a finite band that holds the diagonal (``left, right >= 0``),
        else None."""
        if self.band is None or not all(math.isfinite(side) and side >= 0 for side in self.band):
            return None
        return int(self.band[0]), int(self.band[1])

    @property
    def is_causal(self) -> bool:
        """Does every head attend exactly to the keys at or before the query (``causal()``, ``forward_mask()``,
        the same predicate under either name)?"""
        return self.band == (math.inf, 0)

    def bands_per_head(self, heads: int) -> list[tuple[float, float]] | None:
        """``[(left, right), …]``, one band per head, when head ``c`` of ``heads`` attends exactly to ``i − left <=
        j <= i + right`` (``inf`` for an open side; ``right = −1``: the diagonal excluded), else None."""
        if self.head_bands is not None:
            return list(self.head_bands) if len(self.head_bands) == heads else None
        return None if self.band is None else [self.band] * heads

    def shifted(self, offset: int) -> Mask:
        """The same predicate for queries at absolute positions ``offset, offset + 1, …``: query row ``i``
        of the result is row ``offset + i`` of this mask (incremental decoding: ``offset`` = the number of
        positions already decoded). A band ``(left, right)`` becomes ``(left − offset, right + offset)``."""
        if check_nonnegative_int(offset, "offset") == 0:
            return self
        mod = self.mask_mod
        band = None if self.band is None else (self.band[0] - offset, self.band[1] + offset)
        head_bands = None if self.head_bands is None else tuple((l - offset, r + offset) for l, r in self.head_bands)
        return Mask(lambda b, h, q, kv: mod(b, h, q + offset, kv), f"{self.name}@{offset}", static=self.static,
                    band=band, head_bands=head_bands, cache_key=_combined("shifted", self, offset))

    def __call__(self, b, h, q_idx, kv_idx):
        return self.mask_mod(b, h, q_idx, kv_idx)

    def __and__(self, other: Mask) -> Mask:
        other = _as_mask(other, "&")
        a, c = self.mask_mod, other.mask_mod
        return Mask(
            lambda b, h, q, kv: a(b, h, q, kv) & c(b, h, q, kv),
            f"({self.name} & {other.name})",
            static=self.static and other.static,
            band=None if self.band is None or other.band is None else _band_and(self.band, other.band),
            head_bands=_head_bands_and(self, other),
            cache_key=_combined("&", self, other),
        )

    def __or__(self, other: Mask) -> Mask:
        other = _as_mask(other, "|")
        a, c = self.mask_mod, other.mask_mod
        return Mask(
            lambda b, h, q, kv: a(b, h, q, kv) | c(b, h, q, kv),
            f"({self.name} | {other.name})",
            static=self.static and other.static,
            cache_key=_combined("|", self, other),
        )

    def __invert__(self) -> Mask:
        a = self.mask_mod
        return Mask(lambda b, h, q, kv: ~a(b, h, q, kv), f"~{self.name}", static=self.static,
                    cache_key=_combined("~", self))

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def materialize(self, q_len: int, kv_len: int | None = None, *, batch: int = 1, heads: int = 1,
                    device: torch.device | str | None = None) -> torch.Tensor:
        """Evaluate the predicate on a grid: a bool tensor of shape ``(batch, heads, q_len, kv_len)``."""
        return materialize(self, q_len, kv_len, batch=batch, heads=heads, device=device)


def _band_and(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """The band of two bands' intersection."""
    return min(a[0], b[0]), min(a[1], b[1])


def _head_bands_and(a: Mask, b: Mask) -> tuple[tuple[float, float], ...] | None:
    """The per-head bands of ``a & b`` when at least one of them is per-head and both are bands on every head."""
    if a.head_bands is None and b.head_bands is None:
        return None
    per_head = a.head_bands if a.head_bands is not None else b.head_bands
    if per_head is None:
        return None
    heads = len(per_head)
    a_bands, b_bands = a.bands_per_head(heads), b.bands_per_head(heads)
    if a_bands is None or b_bands is None:
        return None
    return tuple(_band_and(x, y) for x, y in zip(a_bands, b_bands))


def _combined(op: str, *parts):
    """The cache key of a mask built from ``parts`` (masks and plain values), or None when a part has none."""
    keys = [p.cache_key if isinstance(p, Mask) else p for p in parts]
    return None if any(k is None for k in keys) else (op, *keys)


def _as_mask(other, op: str) -> Mask:
    if not isinstance(other, Mask):
        raise ArgumentTypeError(f"cannot combine a Mask with {type(other).__name__} using '{op}'; expected a Mask")
    return other


def full() -> Mask:
    """Every query attends to every key."""
    return Mask(lambda b, h, q, kv: q == q, "full", band=(math.inf, math.inf), cache_key="full")


def forward_mask(include_diagonal: bool = True) -> Mask:
    """Forward (past-looking) mask: key ``j`` is visible from query ``i`` when ``j < i`` (``j <= i``
    with ``include_diagonal``). DiSA/MTSA's ``M^fw`` is the strict form."""
    if check_bool(include_diagonal, "include_diagonal"):
        return Mask(lambda b, h, q, kv: kv <= q, "forward", band=(math.inf, 0), cache_key="forward")
    return Mask(lambda b, h, q, kv: kv < q, "forward_strict", band=(math.inf, -1), cache_key="forward_strict")


def backward_mask(include_diagonal: bool = True) -> Mask:
    """Backward (future-looking) mask: key ``j`` is visible from query ``i`` when ``j > i`` (``j >= i``
    with ``include_diagonal``). DiSA/MTSA's ``M^bw`` is the strict form."""
    if check_bool(include_diagonal, "include_diagonal"):
        return Mask(lambda b, h, q, kv: kv >= q, "backward", band=(0, math.inf), cache_key="backward")
    return Mask(lambda b, h, q, kv: kv > q, "backward_strict", band=(-1, math.inf), cache_key="backward_strict")


def forward(include_diagonal: bool = True) -> Mask:
    """Deprecated name of :func:`forward_mask` (it read as ``nn.Module.forward``); kept for one release."""
    warn_renamed("maskattn.masks.forward()", "masks.forward_mask()")
    return forward_mask(include_diagonal)


def backward(include_diagonal: bool = True) -> Mask:
    """Deprecated name of :func:`backward_mask` (it read as ``nn.Module.backward``); kept for one release."""
    warn_renamed("maskattn.masks.backward()", "masks.backward_mask()")
    return backward_mask(include_diagonal)


def causal() -> Mask:
    """Decoder mask: a query sees itself and earlier keys (the same predicate as ``forward_mask()``). For
    queries at absolute positions ``offset …`` (incremental decoding) use ``causal().shifted(offset)``."""
    return Mask(lambda b, h, q, kv: kv <= q, "causal", band=(math.inf, 0), cache_key="forward")


def band(left: int, right: int) -> Mask:
    """Band: key ``j`` is visible from query ``i`` when ``i − left <= j <= i + right`` (``left`` keys
    before the query, ``right`` after). ``band(r, r)`` is :func:`window`; ``band(r, 0)`` is causal local
    attention. Finite bands run on the O(n · band) local kernels."""
    check_nonnegative_int(left, "left")
    check_nonnegative_int(right, "right")
    # the predicate compares positions: a side past any sequence is that far (int64, with room for an offset)
    near_left, near_right = min(left, _FAR), min(right, _FAR)
    return Mask(lambda b, h, q, kv: (kv >= q - near_left) & (kv <= q + near_right), f"band({left}, {right})",
                band=(left, right), cache_key=("band", left, right))


def window(radius: int) -> Mask:
    """Local window: key ``j`` is visible from query ``i`` when ``|i - j| <= radius`` (``band(radius, radius)``)."""
    check_nonnegative_int(radius, "radius")
    return Mask(band(radius, radius).mask_mod, f"window({radius})", band=(radius, radius),
                cache_key=("band", radius, radius))


def sequence_window(radius: torch.Tensor) -> Mask:
    """A window whose radius depends on the sequence: key ``j`` is visible from query ``i`` of sequence
    ``b`` when ``|i − j| <= radius[b]`` (MAN §4.2's SMAN₁, ``b = sqrt(L)/2`` per sentence). ``radius``
    is a ``(B,)`` float or int tensor."""
    if not isinstance(radius, torch.Tensor) or radius.dim() != 1:
        raise ArgumentTypeError(f"radius must be a 1-D tensor with one radius per sequence, got {describe(radius)}")
    return Mask(lambda b, h, q, kv: (q - kv).abs() <= radius[b], "sequence_window", static=False,
                cache_key=("sequence_window", id(radius)))


def key_padding(key_padding_mask: torch.Tensor) -> Mask:
    """Mask out padded keys. ``key_padding_mask`` is ``(B, n)`` bool with ``True = padding``
    (PyTorch's ``nn.MultiheadAttention`` convention); the returned predicate is ``True = attend``."""
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        raise ArgumentTypeError("key_padding_mask must be a bool tensor of shape (batch, seq_len) with True = padding, "
                        f"got {describe(key_padding_mask)}")
    if key_padding_mask.dim() != 2:
        raise ArgumentError(f"key_padding_mask must have shape (batch, seq_len), got {tuple(key_padding_mask.shape)}")
    keep = ~key_padding_mask
    return Mask(lambda b, h, q, kv: keep[b, kv], "key_padding", static=False,
                cache_key=("key_padding", id(key_padding_mask)))


def per_head(head_masks: Sequence[Mask]) -> Mask:
    """A different mask per head: head ``c`` uses ``head_masks[c]`` (MTSA's multi-mask)."""
    head_masks = list(head_masks)
    if not head_masks:
        raise ArgumentError("head_masks must contain at least one Mask")
    for i, m in enumerate(head_masks):
        if not isinstance(m, Mask):
            raise ArgumentTypeError(f"head_masks[{i}] must be a Mask, got {type(m).__name__}")
    mods = [m.mask_mod for m in head_masks]

    def mask_mod(b, h, q, kv):
        out = mods[0](b, h, q, kv)
        for c in range(1, len(mods)):
            out = torch.where(h == c, mods[c](b, h, q, kv), out)
        return out

    names = ", ".join(m.name for m in head_masks)
    bands = {m.band for m in head_masks}
    known = tuple(m.band for m in head_masks if m.band is not None)
    head_bands = known if len(known) == len(head_masks) > 1 else None
    return Mask(mask_mod, f"per_head[{names}]", static=all(m.static for m in head_masks),
                band=bands.pop() if len(bands) == 1 else None, head_bands=head_bands,
                cache_key=_combined("per_head", *head_masks))


MASK_NAMES = ("full", "forward", "backward", "forward_strict", "backward_strict", "causal")


def from_name(name: str | Mask) -> Mask:
    """Build a mask from a short name: one of :data:`MASK_NAMES` or ``"window:R"`` (radius ``R``)."""
    if isinstance(name, Mask):
        return name
    if not isinstance(name, str):
        raise ArgumentTypeError(f"mask name must be a str or a Mask, got {type(name).__name__}")
    table = {
        "full": full,
        "forward": lambda: forward_mask(True),
        "backward": lambda: backward_mask(True),
        "forward_strict": lambda: forward_mask(False),
        "backward_strict": lambda: backward_mask(False),
        "causal": causal,
    }
    if name in table:
        return table[name]()
    if name.startswith("window:"):
        try:
            radius = int(name.split(":", 1)[1])
        except ValueError:
            radius = None
        if radius is None or radius < 0:
            raise ArgumentError(f"mask name {name!r}: expected 'window:R' with an integer R >= 0")
        return window(radius)
    raise ArgumentError(f"unknown mask name {name!r}; expected one of {', '.join(MASK_NAMES)} or 'window:R'")


def materialize(mask: Mask, q_len: int, kv_len: int | None = None, *, batch: int = 1, heads: int = 1,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Dense bool tensor ``(batch, heads, q_len, kv_len)`` with ``out[b, h, i, j] = mask(b, h, i, j)``."""
    if not isinstance(mask, Mask):
        raise ArgumentTypeError(f"mask must be a maskattn.masks.Mask, got {type(mask).__name__}")
    kv_len = q_len if kv_len is None else kv_len
    for name, value in (("q_len", q_len), ("kv_len", kv_len), ("batch", batch), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ArgumentError(f"{name} must be a non-negative int, got {value!r}")
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, heads, 1, 1)
    q = torch.arange(q_len, device=device).view(1, 1, q_len, 1)
    kv = torch.arange(kv_len, device=device).view(1, 1, 1, kv_len)
    out = mask.mask_mod(b, h, q, kv)
    return out.expand(batch, heads, q_len, kv_len).contiguous()


def as_dense(mask: Mask | torch.Tensor | None, q_len: int, kv_len: int, *, batch: int, heads: int,
             device: torch.device | str | None = None) -> torch.Tensor | None:
    """A bool tensor broadcastable to ``(batch, heads, q_len, kv_len)`` for a :class:`Mask` (materialised
    with a batch dimension of 1 when it is static), or the tensor / ``None`` passed in unchanged."""
    if isinstance(mask, Mask):
        return materialize(mask, q_len, kv_len, batch=1 if mask.static else batch, heads=heads, device=device)
    return mask


def allowed(mask: Mask | torch.Tensor | None, key_padding_mask: torch.Tensor | None, q_len: int, kv_len: int, *,
            batch: int, heads: int, device: torch.device | str | None = None) -> torch.Tensor | None:
    """The dense bool tensor of allowed (query, key) pairs, broadcastable to ``(batch, heads, q_len, kv_len)``:
    ``mask`` (a :class:`Mask`, a bool tensor or None) and, where ``key_padding_mask`` ``(batch, kv_len)`` is
    True (padding), nothing. None when every pair is allowed."""
    dense = as_dense(mask, q_len, kv_len, batch=batch, heads=heads, device=device)
    if key_padding_mask is None:
        return dense
    keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, m)
    return keep if dense is None else dense & keep


def predicate(mask: Mask | torch.Tensor | None, key_padding_mask: torch.Tensor | None, *, batch: int, heads: int,
              q_len: int, kv_len: int) -> Mask | None:
    """``mask`` (a :class:`Mask`, a bool tensor broadcastable to ``(batch, heads, q_len, kv_len)`` or None)
    and the key padding as one :class:`Mask` predicate (what FlexAttention takes); None when everything is
    allowed."""
    if isinstance(mask, torch.Tensor):
        dense = mask.expand(batch, heads, q_len, kv_len)
        mask = Mask(lambda b, h, q, kv: dense[b, h, q, kv], "dense", static=mask.shape[0] == 1,
                    cache_key=("dense", id(mask)) if mask.shape[0] > 1 else None)
    if key_padding_mask is None:
        return mask
    padding = key_padding(key_padding_mask)
    return padding if mask is None else mask & padding
