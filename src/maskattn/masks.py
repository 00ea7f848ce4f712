"""Positional masks as FlexAttention-style predicates.

A :class:`Mask` wraps a pure function ``mask_mod(b, h, q_idx, kv_idx) -> bool`` (the signature of
``torch.nn.attention.flex_attention``'s ``mask_mod``). ``True`` means *attend*; rows are queries,
columns are keys. Masks compose with ``&``, ``|`` and ``~`` and can be materialised to a dense bool
tensor with :meth:`Mask.materialize` (or :func:`materialize`).

The directional masks follow DiSA / MTSA §2.2: with query ``i`` and key ``j``,

* ``forward``  attends to keys ``j < i`` (``j <= i`` with the diagonal included),
* ``backward`` attends to keys ``j > i`` (``j >= i`` with the diagonal included).

Example::

    >>> from maskattn import masks
    >>> m = masks.forward() & masks.window(2)
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

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

__all__ = [
    "Mask",
    "MaskMod",
    "full",
    "forward",
    "backward",
    "causal",
    "window",
    "key_padding",
    "per_head",
    "from_name",
    "MASK_NAMES",
    "materialize",
    "as_dense",
]


class Mask:
    """A boolean attention mask given as a predicate over ``(b, h, q_idx, kv_idx)``.

    ``mask_mod`` must be built from tensor operations only (comparisons, ``&``, ``|``, indexing of
    captured tensors), so that it runs unchanged inside FlexAttention's ``vmap``.
    ``static`` is ``True`` when the predicate ignores ``b`` (it depends on positions and heads
    only), which lets callers materialise it once with a broadcast batch dimension.
    """

    def __init__(self, mask_mod: MaskMod, name: str, *, static: bool = True,
                 band: tuple[float, float] | None = None):
        if not callable(mask_mod):
            raise TypeError(f"mask_mod must be callable (b, h, q_idx, kv_idx) -> bool, got {type(mask_mod).__name__}")
        self.mask_mod = mask_mod
        self.name = name
        self.static = static
        #: ``(left, right)`` when the mask is exactly the band ``i − left <= j <= i + right`` on every
        #: head (``inf`` for an open side), else None. Finite bands run on the O(n·band) local path.
        self.band = band

    @property
    def finite_band(self) -> tuple[int, int] | None:
        """``(left, right)`` as ints when the mask is a finite band, else None."""
        if self.band is None or not all(math.isfinite(side) for side in self.band):
            return None
        return int(self.band[0]), int(self.band[1])

    def __call__(self, b, h, q_idx, kv_idx):
        return self.mask_mod(b, h, q_idx, kv_idx)

    def __and__(self, other: Mask) -> Mask:
        other = _as_mask(other, "&")
        a, c = self.mask_mod, other.mask_mod
        return Mask(
            lambda b, h, q, kv: a(b, h, q, kv) & c(b, h, q, kv),
            f"({self.name} & {other.name})",
            static=self.static and other.static,
            band=None if self.band is None or other.band is None else (
                min(self.band[0], other.band[0]), min(self.band[1], other.band[1])),
        )

    def __or__(self, other: Mask) -> Mask:
        other = _as_mask(other, "|")
        a, c = self.mask_mod, other.mask_mod
        return Mask(
            lambda b, h, q, kv: a(b, h, q, kv) | c(b, h, q, kv),
            f"({self.name} | {other.name})",
            static=self.static and other.static,
        )

    def __invert__(self) -> Mask:
        a = self.mask_mod
        return Mask(lambda b, h, q, kv: ~a(b, h, q, kv), f"~{self.name}", static=self.static)

    def __repr__(self) -> str:
        return f"Mask({self.name})"

    def materialize(self, q_len: int, kv_len: int | None = None, *, batch: int = 1, heads: int = 1,
                    device: torch.device | str | None = None) -> torch.Tensor:
        """Evaluate the predicate on a grid: a bool tensor of shape ``(batch, heads, q_len, kv_len)``."""
        return materialize(self, q_len, kv_len, batch=batch, heads=heads, device=device)


def _as_mask(other, op: str) -> Mask:
    if not isinstance(other, Mask):
        raise TypeError(f"cannot combine a Mask with {type(other).__name__} using '{op}'; expected a Mask")
    return other


def _check_flag(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def full() -> Mask:
    """Every query attends to every key."""
    return Mask(lambda b, h, q, kv: q == q, "full", band=(math.inf, math.inf))


def forward(include_diagonal: bool = True) -> Mask:
    """Forward (past-looking) mask: key ``j`` is visible from query ``i`` when ``j < i`` (``j <= i``
    with ``include_diagonal``). DiSA/MTSA's ``M^fw`` is the strict form."""
    if _check_flag(include_diagonal, "include_diagonal"):
        return Mask(lambda b, h, q, kv: kv <= q, "forward", band=(math.inf, 0))
    return Mask(lambda b, h, q, kv: kv < q, "forward_strict")


def backward(include_diagonal: bool = True) -> Mask:
    """Backward (future-looking) mask: key ``j`` is visible from query ``i`` when ``j > i`` (``j >= i``
    with ``include_diagonal``). DiSA/MTSA's ``M^bw`` is the strict form."""
    if _check_flag(include_diagonal, "include_diagonal"):
        return Mask(lambda b, h, q, kv: kv >= q, "backward", band=(0, math.inf))
    return Mask(lambda b, h, q, kv: kv > q, "backward_strict")


def causal() -> Mask:
    """Decoder mask: a query sees itself and earlier keys (the same predicate as ``forward()``)."""
    return Mask(lambda b, h, q, kv: kv <= q, "causal", band=(math.inf, 0))


def window(radius: int) -> Mask:
    """Local window: key ``j`` is visible from query ``i`` when ``|i - j| <= radius``."""
    if isinstance(radius, bool) or not isinstance(radius, int):
        raise TypeError(f"radius must be an int, got {radius!r}")
    if radius < 0:
        raise ValueError(f"radius must be >= 0, got {radius}")
    return Mask(lambda b, h, q, kv: (q - kv).abs() <= radius, f"window({radius})", band=(radius, radius))


def key_padding(key_padding_mask: torch.Tensor) -> Mask:
    """Mask out padded keys. ``key_padding_mask`` is ``(B, n)`` bool with ``True = padding``
    (PyTorch's ``nn.MultiheadAttention`` convention); the returned predicate is ``True = attend``."""
    if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
        raise TypeError("key_padding_mask must be a bool tensor of shape (batch, seq_len) with True = padding, "
                        f"got {_describe(key_padding_mask)}")
    if key_padding_mask.dim() != 2:
        raise ValueError(f"key_padding_mask must have shape (batch, seq_len), got {tuple(key_padding_mask.shape)}")
    keep = ~key_padding_mask
    return Mask(lambda b, h, q, kv: keep[b, kv], "key_padding", static=False)


def per_head(head_masks: Sequence[Mask]) -> Mask:
    """A different mask per head: head ``c`` uses ``head_masks[c]`` (MTSA's multi-mask)."""
    head_masks = list(head_masks)
    if not head_masks:
        raise ValueError("head_masks must contain at least one Mask")
    for i, m in enumerate(head_masks):
        if not isinstance(m, Mask):
            raise TypeError(f"head_masks[{i}] must be a Mask, got {type(m).__name__}")
    mods = [m.mask_mod for m in head_masks]

    def mask_mod(b, h, q, kv):
        out = mods[0](b, h, q, kv)
        for c in range(1, len(mods)):
            out = torch.where(h == c, mods[c](b, h, q, kv), out)
        return out

    names = ", ".join(m.name for m in head_masks)
    bands = {m.band for m in head_masks}
    return Mask(mask_mod, f"per_head[{names}]", static=all(m.static for m in head_masks),
                band=bands.pop() if len(bands) == 1 else None)


MASK_NAMES = ("full", "forward", "backward", "forward_strict", "backward_strict", "causal")


def from_name(name: str) -> Mask:
    """Build a mask from a short name: one of :data:`MASK_NAMES` or ``"window:R"`` (radius ``R``)."""
    if isinstance(name, Mask):
        return name
    if not isinstance(name, str):
        raise TypeError(f"mask name must be a str or a Mask, got {type(name).__name__}")
    table = {
        "full": full,
        "forward": lambda: forward(True),
        "backward": lambda: backward(True),
        "forward_strict": lambda: forward(False),
        "backward_strict": lambda: backward(False),
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
            raise ValueError(f"mask name {name!r}: expected 'window:R' with an integer R >= 0")
        return window(radius)
    raise ValueError(f"unknown mask name {name!r}; expected one of {', '.join(MASK_NAMES)} or 'window:R'")


def materialize(mask: Mask, q_len: int, kv_len: int | None = None, *, batch: int = 1, heads: int = 1,
                device: torch.device | str | None = None) -> torch.Tensor:
    """Dense bool tensor ``(batch, heads, q_len, kv_len)`` with ``out[b, h, i, j] = mask(b, h, i, j)``."""
    if not isinstance(mask, Mask):
        raise TypeError(f"mask must be a maskattn.masks.Mask, got {type(mask).__name__}")
    kv_len = q_len if kv_len is None else kv_len
    for name, value in (("q_len", q_len), ("kv_len", kv_len), ("batch", batch), ("heads", heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
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


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__}"
