"""The same prompts for every framework: jsonl rows in the EasyR1/verl convention, with the
images or video frames as PNG files beside them.

    python bench/peers/prompts.py --workload easyvqa --rows 256 --out /tmp/peers/easyvqa
    python bench/peers/prompts.py --workload video32 --rows 64 --out /tmp/peers/video32

`easyvqa` takes the public easy-VQA train split in the seed's order (rollplex's own
`data=easyvqa` template appended to each question); `video8` / `video32` take rollplex's
synthetic moving-shapes task at 8 or 32 frames of 448x448. Rollplex reads the file with
`data=jsonl`, TRL and verl with the loaders in `trl_grpo.py` and `verl_grpo.py`, so every
framework renders the same text through the folder's own chat template.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollplex.data import build_source
from rollplex.specs.data import DataSpec

WORKLOADS = {
    "easyvqa": dict(source="easyvqa", frames=1, size=None),
    "video8": dict(source="synthetic_video", frames=8, size=448),
    "video32": dict(source="synthetic_video", frames=32, size=448),
}
EASYVQA_TEMPLATE = "{problem} Answer with one word."  # conf/data/easyvqa.yaml


def write_rows(workload: str, rows: int, out: Path, seed: int = 0, split: str = "train") -> Path:
    """`rows` prompts of the workload as `out/<split>.jsonl`; returns its path."""
    w = WORKLOADS[workload]
    spec = DataSpec(source=w["source"], image_size=w["size"] or 84)
    source = build_source(spec, split, seed, frames=w["frames"])
    media = out / f"{split}_media"
    media.mkdir(parents=True, exist_ok=True)
    lines = []
    for k, index in enumerate(source.rows(0, rows)):
        sample = source.row(index)
        if sample.video is not None:
            frames = []
            for t, frame in enumerate(sample.video):
                frame.save(media / f"{k}_{t}.png")
                frames.append(f"{media.name}/{k}_{t}.png")
            row = {
                "problem": "<video>" + sample.problem,
                "answer": sample.answer,
                "videos": [frames],
            }
        else:
            paths = []
            for j, image in enumerate(sample.images):
                image.save(media / f"{k}_{j}.png")
                paths.append(f"{media.name}/{k}_{j}.png")
            problem = EASYVQA_TEMPLATE.replace("{problem}", sample.problem)
            row = {"problem": "<image>" + problem, "answer": sample.answer, "images": paths}
        lines.append(json.dumps(row))
    path = out / f"{split}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), required=True)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--eval-rows", type=int, default=0, help="also a test.jsonl of N rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    print(write_rows(args.workload, args.rows, args.out, args.seed))
    if args.eval_rows:
        print(write_rows(args.workload, args.eval_rows, args.out, args.seed, split="test"))


if __name__ == "__main__":
    main()
