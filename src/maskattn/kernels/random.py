"""Seeded dropout for the recomputing kernels: forward draws a keep-mask from a generator seeded with a
fresh seed, backward rebuilds the generator from the same seed and redraws the identical mask."""

from __future__ import annotations

import torch

__all__ = ["new_seed", "seeded_generator", "keep_mask"]


def new_seed() -> int:
    """A fresh seed from PyTorch's default (CPU) generator, so ``torch.manual_seed`` makes runs repeatable."""
    return int(torch.randint(0, 2**62, ()).item())


def seeded_generator(device: torch.device | str, seed: int) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**63)
    return generator


def keep_mask(like: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Inverted-dropout factors shaped like ``like``: ``1 / (1 − p)`` with probability ``1 − p``, else 0."""
    keep = torch.rand(like.shape, generator=generator, device=like.device, dtype=like.dtype) >= p
    return keep.to(like.dtype).div_(1.0 - p)
