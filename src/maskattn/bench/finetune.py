"""Training-step time of a pretrained encoder fine-tuned with and without maskattn conversions.

``python -m maskattn.bench.finetune [--pretrained all-MiniLM-L6-v2] [--batch 32] [--lengths 16,64]``

For the unchanged encoder and each conversion of :data:`VARIANTS` (the placements compared in
``docs/results.md``), one full training step of the classifier that ``maskattn train`` builds
(:class:`~maskattn.models.pretrained.PretrainedClassifier`: encoder → mean pooling → linear): forward,
cross-entropy, backward and an AdamW step, on a batch of ``batch`` random token ids of each length (no
padding). Prints a Markdown table (median ms per step over ``--repeats`` after ``--warmup`` steps, and the
ratio to the unchanged encoder) and writes it with every figure to ``--out`` (``finetune.json``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.config import ModelConfig
from ..models.pretrained import PretrainedClassifier, load_pretrained_encoder
from .measure import machine_info, time_call
from .settings import parse_lengths

__all__ = ["VARIANTS", "step_time", "main"]

#: the conversions compared (``model.convert`` of the presets' runs); ``None``: the unchanged encoder
VARIANTS = {
    "unchanged": None,
    "csan2d layers 0-2": {"mechanism": "csan2d", "layers": [0, 1, 2]},
    "sman radius 4, layers 0-2": {"mechanism": "sman", "layers": [0, 1, 2], "radius": 4},
    "dman every layer": {"mechanism": "dman", "layers": None},
    "mtsa top layer": {"mechanism": "mtsa", "layers": [-1]},
}


def step_time(model: PretrainedClassifier, batch: int, length: int, *, repeats: int, warmup: int,
              num_classes: int = 6, seed: int = 0) -> dict[str, float]:
    """Wall time of one training step (module docstring) at ``(batch, length)``: :func:`time_call`'s dict."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model.encoder.config.vocab_size
    tokens = torch.randint(1, vocab, (batch, length), generator=generator)  # (B, n), any id but padding
    padding = torch.zeros(batch, length, dtype=torch.bool)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model.train()

    def step():
        loss = F.cross_entropy(model(tokens, padding), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return time_call(step, repeats=repeats, warmup=warmup)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m maskattn.bench.finetune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", default="all-MiniLM-L6-v2", help="a local model folder or package name")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lengths", default="16,64", help="comma-separated token counts per input")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1: steadier figures)")
    parser.add_argument("--out", type=Path, default=None, help="folder for finetune.json and finetune.md")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        raise SystemExit("--batch, --repeats and --threads must be >= 1, --warmup >= 0")
    try:
        lengths = parse_lengths(args.lengths)
    except ValueError as exc:
        raise SystemExit(f"--lengths: {exc}") from None
    torch.set_num_threads(args.threads)
    records = []
    for name, conversion in VARIANTS.items():
        cfg = ModelConfig(pretrained=args.pretrained, convert=conversion, mlp_layers=0)
        torch.manual_seed(0)
        encoder, tokenizer = load_pretrained_encoder(cfg, replay=True)
        model = PretrainedClassifier.from_config(encoder, tokenizer, cfg, num_classes=6)
        for length in lengths:
            timing = step_time(model, args.batch, length, repeats=args.repeats, warmup=args.warmup)
            records.append({"variant": name, "convert": conversion, "batch": args.batch, "length": length,
                            "ms_median": 1e3 * timing["median_s"], "ms_min": 1e3 * timing["min_s"],
                            "ms_max": 1e3 * timing["max_s"], "repeats": args.repeats})
    base = {r["length"]: r["ms_median"] for r in records if r["convert"] is None}
    for record in records:
        record["ratio"] = record["ms_median"] / base[record["length"]]
    header = "| variant | " + " | ".join(f"n = {n}: ms/step (× unchanged)" for n in lengths) + " |"
    lines = [header, "|---|" + "---:|" * len(lengths)]
    for name in VARIANTS:
        cells = [f"{r['ms_median']:.0f} ({r['ratio']:.2f}×)" for n in lengths for r in records
                 if r["variant"] == name and r["length"] == n]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(f"training step, batch {args.batch}, {args.threads} thread(s), median of {args.repeats}\n\n{table}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        info = {"machine": machine_info("cpu"), "threads": args.threads, "pretrained": args.pretrained,
                "records": records}
        (args.out / "finetune.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        (args.out / "finetune.md").write_text(table + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
