"""The Triton kernels' offline tools — they compile the kernels for GPUs this machine does not have and read the
machine code; nothing in the runtime or the kernels imports them (docs/design.md §3, §7; docs/gpu.md):

* :mod:`.compile_check` — every kernel, in the configurations the launchers choose, compiled for every architecture
  ``auto`` accepts: refused launches, compile errors, shared memory and registers over a limit, spills, wgmma
  serialisation (CI: ``python -m maskattn.kernels.triton.offline.compile_check --matrix ci``);
* :mod:`.perf_report` — what each kernel pass spends per score, read from its SASS beside an FlashAttention-2-class
  anchor, and the time that predicts (docs/gpu/offline-perf.md).
"""
