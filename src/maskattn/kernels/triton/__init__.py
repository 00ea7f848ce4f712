"""The ``triton`` backend: fused Triton kernels, forward and backward, for the mechanisms whose PyTorch paths
cost far more than the attention they replace on a GPU (docs/design.md §3).

* :mod:`.tensorized` — MTSA / Fast-DiSA: sigmoid attention over ``[v ⊙ E ; E]`` with two float32 accumulators
  and the division at the end, per-head band skipping, Appendix A.3's dropout in the kernel.
* :mod:`.dman`       — DMAN: FlashAttention-2 with the gate ``log σ(a_t + P[t − s] + U_h)`` in the scores and
  deterministic gradients of ``a``, ``P``, ``U`` (no atomics).
* :mod:`.band`       — CSAN 1D / 2D and SMAN: softmax over a band (and CSAN 2D's head area), O(n · band).
* :mod:`.runtime`    — where they run (CUDA; CPU tensors under ``TRITON_INTERPRET=1``, for tests) and tile sizes.

Each is a ``torch.library`` custom operator with a registered backward, so ``torch.compile(fullgraph=True)``
traces it as one node for any sequence length. The modules named ``*_jit`` hold the ``@triton.jit`` code and are
imported only when a kernel first runs (:func:`.runtime.load`), so importing maskattn never imports Triton.
"""
