"""Machine code of a Triton launch, compiled and read without a GPU (docs/gpu/offline-perf.md): compiled for
``GPUTarget("cuda", arch, 32)`` as ``JITFunction.run`` would (:func:`compile_launch`), disassembled with the
``nvdisasm`` and ``cuobjdump`` the ``triton`` wheel bundles (:func:`disassemble`), and read — instructions
(:func:`parse_sass`), the innermost loops and the hot ones (:func:`innermost_loops`, :func:`hot_loop`), the lightest
and the heaviest path through a loop body (:func:`path_counts`), what each instruction costs (:func:`classify`:
tensor-core FLOPs on wgmma and ``mma.sync``, ``MUFU`` by kind, global loads, shared-memory traffic, all warp
instructions), spills and occupancy. Used by the report (:mod:`.perf_report`) and by the comparison with Triton's
tutorial (:mod:`.tutorial`)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field

__all__ = ["Instruction", "parse_sass", "innermost_loops", "hot_loop", "hot_loops", "path_counts", "Counts", "classify",
           "spilled_bytes", "occupancy", "disassemble", "compile_launch"]

#: shared memory per SM (bytes) and per block reserved by the driver, for occupancy
_SMEM_PER_SM = {80: 164 * 1024, 86: 100 * 1024, 90: 228 * 1024}
_REGISTERS_PER_SM = 65536
_MAX_WARPS_PER_SM = {80: 64, 86: 48, 90: 64}
_MAX_BLOCKS_PER_SM = 32


# --------------------------------------------------------------------------------------------------
# SASS: parsing, the hot loop, its paths, what each instruction costs
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its address, predicate (``@P0``, ``@!PT`` …, or empty), opcode with modifiers
    (``HMMA.16816.F32.BF16``) and operand text; ``label`` the label that precedes it, if any."""

    address: int
    predicate: str
    opcode: str
    operands: str
    label: str = ""

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    @property
    def target(self) -> str | None:
        """The label a branch jumps to."""
        if self.base not in ("BRA", "BRX", "JMP"):
            return None
        found = re.search(r"\(\s*(\.L_[\w]+)\s*\)", self.operands)
        return found.group(1) if found else None

    @property
    def dead(self) -> bool:
        """Never executed (``@!PT``: the padding that nvdisasm prints)."""
        return self.predicate == "@!PT"

    @property
    def conditional(self) -> bool:
        return bool(self.predicate) and self.predicate != "@PT"


_LINE = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_[\w]+):")


def parse_sass(text: str) -> list[Instruction]:
    """The instructions of ``nvdisasm -c`` output (one function), in address order, with their labels."""
    instructions: list[Instruction] = []
    label = ""
    for line in text.splitlines():
        found = _LABEL.match(line)
        if found:
            label = found.group(1)
            continue
        found = _LINE.match(line)
        if found:
            address, predicate, opcode, operands = found.groups()
            instructions.append(Instruction(int(address, 16), (predicate or "").strip(), opcode, operands.strip(),
                                            label))
            label = ""
    return instructions


def _is_tensor_core(ins: Instruction) -> bool:
    return ins.base in ("HMMA", "HGMMA")


def innermost_loops(instructions: list[Instruction]) -> list[tuple[int, int]]:
    """``(first, last)`` indices of every loop (a backward branch to a label) that contains no other loop, in
    address order."""
    where = {ins.label: i for i, ins in enumerate(instructions) if ins.label}
    loops = {(where[ins.target], i) for i, ins in enumerate(instructions)
             if ins.target is not None and ins.target in where and where[ins.target] <= i}
    return sorted((a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops))


def _tensor_instructions(instructions: list[Instruction], loop: tuple[int, int]) -> int:
    return sum(_is_tensor_core(x) for x in instructions[loop[0]:loop[1] + 1])


def hot_loop(instructions: list[Instruction]) -> tuple[int, int] | None:
    """``(first, last)`` indices of the hot loop: among the innermost loops, the one with the most tensor-core
    instructions (then the longest); None without a loop."""
    inner = innermost_loops(instructions)
    if not inner:
        return None
    return max(inner, key=lambda ab: (_tensor_instructions(instructions, ab), ab[1] - ab[0]))


def hot_loops(instructions: list[Instruction]) -> list[tuple[int, int]]:
    """The hot loops: :func:`hot_loop`'s, and every other innermost loop with as many tensor-core instructions — a
    kernel that runs the same products in two branch-free loops (DMAN's near tiles, then its far tiles) has two, in
    address order."""
    first = hot_loop(instructions)
    if first is None:
        return []
    most = _tensor_instructions(instructions, first)
    return [ab for ab in innermost_loops(instructions) if _tensor_instructions(instructions, ab) == most]


def path_counts(body: list[Instruction]) -> tuple[list[Instruction], list[Instruction]]:
    """``(lightest, heaviest)``: the instructions executed along the path through a loop body with the fewest and
    with the most instructions (forward branches inside the body; the backward branch closes the loop)."""
    starts = {0}
    index = {ins.label: i for i, ins in enumerate(body) if ins.label}
    for i, ins in enumerate(body):
        if ins.label:
            starts.add(i)
        if ins.target is not None and not ins.dead:
            starts.add(i + 1)
    bounds = sorted(s for s in starts if s < len(body))
    blocks = [(s, (bounds[k + 1] if k + 1 < len(bounds) else len(body))) for k, s in enumerate(bounds)]
    block_of = {s: k for k, (s, _) in enumerate(blocks)}
    successors: list[list[int]] = []
    for k, (_, e) in enumerate(blocks):
        last = body[e - 1]
        out = []
        target = last.target if not last.dead else None
        if target is not None and target in index and index[target] > e - 1:
            out.append(block_of[index[target]])
        if target is None or last.conditional or index.get(target, -1) <= e - 1:
            if k + 1 < len(blocks):
                out.append(k + 1)
        successors.append(out)
    weight = [sum(not ins.dead for ins in body[s:e]) for s, e in blocks]
    best: list[tuple[float, list[int]]] = [(math.inf, [])] * len(blocks)
    worst: list[tuple[float, list[int]]] = [(-math.inf, [])] * len(blocks)
    best[0], worst[0] = (weight[0], [0]), (weight[0], [0])
    for k in range(len(blocks)):
        for nxt in successors[k]:
            if best[k][0] + weight[nxt] < best[nxt][0]:
                best[nxt] = (best[k][0] + weight[nxt], best[k][1] + [nxt])
            if worst[k][0] + weight[nxt] > worst[nxt][0]:
                worst[nxt] = (worst[k][0] + weight[nxt], worst[k][1] + [nxt])
    end = len(blocks) - 1

    def flatten(path):
        return [ins for k in path for ins in body[blocks[k][0]:blocks[k][1]] if not ins.dead]
    return flatten(best[end][1]), flatten(worst[end][1])


_WIDTH = {"128": 16, "64": 8, "32": 4, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def _bytes(opcode: str) -> int:
    """Bytes per thread of a load or store from its width modifier (32 bits when none)."""
    for part in reversed(opcode.split(".")[1:]):
        if part in _WIDTH:
            return _WIDTH[part]
    return 4


def _ldsm_bytes(opcode: str) -> int:
    """``LDSM.16.M88.4`` / ``STSM``: four 8 × 8 matrices of 16-bit elements per warp = 16 bytes per thread."""
    parts = opcode.split(".")
    count = int(parts[-1]) if parts[-1] in ("1", "2", "4") else 1
    return 4 * count


_HGMMA = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)")
#: m, n, k of ``HMMA`` shapes
_HMMA_SHAPES = {"16816": (16, 8, 16), "1688": (16, 8, 8), "16832": (16, 8, 32), "884": (8, 8, 4)}


def _mma_flops(ins: Instruction) -> tuple[float, float]:
    """``(FLOPs per warp that executes it, shared-memory operand bytes per warp)`` of a tensor-core instruction:
    ``HMMA.16816`` is m16n8k16 per warp; ``HGMMA.64xNxK`` is one warpgroup's (four warps') 64 × N × K product, its
    B operand (and A when it is a descriptor, not registers) read from shared memory (16-bit elements)."""
    found = _HGMMA.match(ins.opcode)
    if found:
        m, n, k = (int(x) for x in found.groups())
        operands = [o.strip() for o in ins.operands.split(",")]
        smem = n * k * 2 + (m * k * 2 if len(operands) > 1 and operands[1].startswith("gdesc") else 0)
        return 2.0 * m * n * k / 4, smem / 4
    parts = ins.opcode.split(".")
    if parts[0] == "HMMA" and len(parts) > 1 and parts[1] in _HMMA_SHAPES:
        m, n, k = _HMMA_SHAPES[parts[1]]
        return 2.0 * m * n * k, 0.0
    return 0.0, 0.0


@dataclass
class Counts:
    """Per-warp instruction counts of a stretch of SASS (multiply by the warps of a block and by 32 for threads);
    bytes are per thread."""

    instructions: int = 0
    tensor: int = 0
    hgmma: int = 0
    tensor_flops: float = 0.0
    wgmma_flops: float = 0.0
    mufu: dict[str, float] = field(default_factory=dict)
    ldg: int = 0
    ldg_bytes: int = 0
    shared: int = 0
    shared_bytes: float = 0.0
    wgmma_shared_bytes: float = 0.0
    spill_stores: int = 0

    def add(self, other: "Counts", times: float = 1.0) -> "Counts":
        out = Counts(**{k: v for k, v in asdict(self).items() if k != "mufu"}, mufu=dict(self.mufu))
        for name in ("instructions", "tensor", "hgmma", "tensor_flops", "wgmma_flops", "ldg", "ldg_bytes", "shared", "shared_bytes",
                     "wgmma_shared_bytes", "spill_stores"):
            setattr(out, name, getattr(out, name) + times * getattr(other, name))
        for key, value in other.mufu.items():
            out.mufu[key] = out.mufu.get(key, 0.0) + times * value
        return out

    @property
    def mufu_total(self) -> float:
        return float(sum(self.mufu.values()))


def classify(instructions: list[Instruction]) -> Counts:
    """Count ``instructions`` by kind (:class:`Counts`); ``@!PT`` padding is skipped."""
    counts = Counts()
    for ins in instructions:
        if ins.dead:
            continue
        counts.instructions += 1
        base = ins.base
        if base in ("HMMA", "HGMMA"):
            counts.tensor += 1
            counts.hgmma += base == "HGMMA"
            flops, smem = _mma_flops(ins)
            counts.tensor_flops += flops
            counts.wgmma_flops += flops if base == "HGMMA" else 0.0
            counts.wgmma_shared_bytes += smem
        elif base == "MUFU":
            kind = ins.opcode.split(".")[1] if "." in ins.opcode else "?"
            counts.mufu[kind] = counts.mufu.get(kind, 0.0) + 1
        elif base in ("LDG", "LDGSTS"):
            counts.ldg += 1
            counts.ldg_bytes += _bytes(ins.opcode)
            if base == "LDGSTS":  # the copy lands in shared memory
                counts.shared += 1
                counts.shared_bytes += _bytes(ins.opcode)
        elif base in ("LDS", "STS"):
            counts.shared += 1
            counts.shared_bytes += _bytes(ins.opcode)
        elif base in ("LDSM", "STSM"):
            counts.shared += 1
            counts.shared_bytes += _ldsm_bytes(ins.opcode)
        elif base == "STL":
            counts.spill_stores += 1
    return counts


def spilled_bytes(sass: str) -> int:
    """Bytes a thread stores to local memory (``STL``: register spills) in one pass over the code."""
    return sum(_WIDTH.get(width or "32", 4) for width in re.findall(r"STL(?:\.(\d+))?", sass))


def occupancy(arch: int, registers: int, warps: int, smem: int) -> tuple[int, float]:
    """``(blocks per SM, fraction of the SM's warp slots)`` that ``registers`` per thread (allocated per warp in
    units of 256), ``warps`` per block and ``smem`` bytes of shared memory per block (plus 1 KB the driver
    reserves) allow."""
    per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_registers = (_REGISTERS_PER_SM // per_warp) // warps
    by_smem = _SMEM_PER_SM[arch] // (smem + 1024) if smem else _MAX_BLOCKS_PER_SM
    by_warps = _MAX_WARPS_PER_SM[arch] // warps
    blocks = max(0, min(by_registers, by_smem, by_warps, _MAX_BLOCKS_PER_SM))
    return blocks, blocks * warps / _MAX_WARPS_PER_SM[arch]


# --------------------------------------------------------------------------------------------------
# the tiles each program visits (mirrors of the kernels' loop bounds)
# --------------------------------------------------------------------------------------------------


def _tool(name: str) -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def disassemble(cubin: bytes) -> tuple[str, int]:
    """``(nvdisasm -c text, registers per thread)`` of a cubin (``cuobjdump -res-usage``)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([_tool("nvdisasm"), "-c", path], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", path], capture_output=True, text=True).stdout
    found = re.search(r"REG:(\d+)", usage)
    return sass, int(found.group(1)) if found else 0


def compile_launch(launch, arch: int):
    """``(cubin, shared bytes, constexprs by name, options)`` of a recorded launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .compile_check import bind
    options, signature, constexprs, attrs = bind(launch.kernel, launch.args, launch.kwargs, arch)
    compiled = triton.compile(ASTSource(launch.kernel, signature, constexprs, attrs),
                              target=GPUTarget("cuda", arch, 32), options=dict(options.__dict__))
    names = launch.kernel.arg_names
    named = {names[path[0]]: value for path, value in constexprs.items()}
    return compiled.asm["cubin"], int(compiled.metadata.shared or 0), named, dict(options.__dict__)
