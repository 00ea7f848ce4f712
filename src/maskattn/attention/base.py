"""Helpers shared by the attention modules: argument checks and head reshapes."""

from __future__ import annotations

import torch

from .._validation import check_choice, check_key_padding_mask, check_positive_int, check_probability, describe


def check_dims(d_model, num_heads, *, divisible: bool = True) -> tuple[int, int]:
    check_positive_int(d_model, "d_model")
    check_positive_int(num_heads, "num_heads")
    if divisible and d_model % num_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    return d_model, num_heads


def check_input(x, d_model: int, key_padding_mask, name: str = "x"):
    """Validate a module input ``(B, n, d_model)`` and its ``(B, n)`` padding mask (True = padding)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of shape (batch, seq_len, {d_model}), got {describe(x)}")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (batch, seq_len, {d_model}), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    B, n, _ = x.shape
    kpm = check_key_padding_mask(key_padding_mask, "key_padding_mask", B, n, f"input is {tuple(x.shape)}")
    if kpm is not None and kpm.device != x.device:
        raise ValueError(f"key_padding_mask is on {kpm.device} but {name} is on {x.device}")
    return kpm


def needs_grad(module: torch.nn.Module, *tensors: torch.Tensor) -> bool:
    """Will autograd run through this call? (decides whether CPU-inference-only backends may be used)"""
    if not torch.is_grad_enabled():
        return False
    return any(t.requires_grad for t in tensors) or any(p.requires_grad for p in module.parameters())


def add_qkv_projections(module: torch.nn.Module, d_model: int, *, bias: bool) -> None:
    """The standard fused ``in_proj`` (q, k, v) and ``out_proj`` of multi-head attention, Glorot-initialised
    with zero biases; shared so that MHA-style modules have identical parameters and ``state_dict`` keys."""
    module.in_proj = torch.nn.Linear(d_model, 3 * d_model, bias=bias)
    module.out_proj = torch.nn.Linear(d_model, d_model, bias=bias)
    torch.nn.init.xavier_uniform_(module.in_proj.weight)
    if bias:
        torch.nn.init.zeros_(module.in_proj.bias)
        torch.nn.init.zeros_(module.out_proj.bias)


def split_heads(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    B, n, d = t.shape
    return t.view(B, n, num_heads, d // num_heads).transpose(1, 2)  # (B, n, d) -> (B, H, n, d/H)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    B, H, n, d_h = t.shape
    return t.transpose(1, 2).reshape(B, n, H * d_h)  # (B, H, n, d_h) -> (B, n, H·d_h)


def zero_padding(out: torch.Tensor, kpm) -> torch.Tensor:
    """Outputs at padded positions are exactly 0."""
    if kpm is None:
        return out
    return out.masked_fill(kpm.unsqueeze(-1), 0.0)


__all__ = ["check_dims", "check_input", "split_heads", "merge_heads", "zero_padding", "needs_grad", "add_qkv_projections", "check_choice",
           "check_probability"]
