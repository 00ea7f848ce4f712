"""The fast paths: autograd kernels that compute what :mod:`maskattn.functional` specifies, without the
n×n (or n×n×d) tensors of the reference math (docs/design.md §3).

* :mod:`.sigmoid`    — blocked ``(sigmoid(q kᵀ) ⊙ mask) @ x``, recomputed in backward (MTSA's log-sigmoid
  token2token scores, whose softmax normalisation cancels in the factorised form).
* :mod:`.tensorized` — MTSA's factorised attention over ``[v ⊙ E ; E]`` in one autograd node.
* :mod:`.banded`     — softmax attention over a band ``i − left <= j <= i + right`` (and CSAN 2D's head
  area) in O(n · band) time and memory.
* :mod:`.dman`       — DMAN's dynamic-mask attention in tiles, exact gradients of the mask parameters.
* :mod:`.flex`       — the FlexAttention call (block masks, compilation).
* :mod:`.random`     — seeded dropout masks that backward redraws identically.

Each kernel is tested against the float64 reference of its mechanism (tests/test_*.py, parametrised over
the backends of :data:`maskattn.backends.FAMILIES`).
"""
