"""verl's GRPO trainer (FSDP actor and reference, vLLM rollout in its hybrid engine) on the
peers' shared prompts and model folder, on one GPU, timed per step from its own metrics.

    python bench/peers/verl_grpo.py --model <folder> --data /tmp/peers/easyvqa/train.jsonl \
        --shape qwen2_5_vl_7b --workload easyvqa --steps 6 --out row.json

verl 0.9.1 pins transformers < 5.11 and needs ray, so it runs from its own site folder
(bench/peers/README.md). The rows become verl's parquet (a chat prompt with `<image>` /
`<video>` in the text, `images` / `videos`, `reward_model.ground_truth`); the reward is
rollplex's exact match (`verl_reward.py`). The settings map onto verl's keys as its
Qwen2.5-VL GRPO example sets them, at one GPU: one update per step
(ppo_mini_batch_size = prompts per step), the k3 KL loss (`low_var_kl`), token-mean,
gradient checkpointing, the reference's parameters offloaded, vLLM at
`--vllm-memory` with `free_cache_engine`, and `ignore_eos` so every response runs to the
cap. verl's `timing_s/*` metrics (file logger) give the step and its phases.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from peer_row import row, write  # bench/peers/ is on sys.path as the script's folder
from settings import PeerSettings

HERE = Path(__file__).resolve().parent


def to_parquet(rows_path: Path, out: Path) -> tuple[Path, bool]:
    """verl's row format; returns (parquet path, has video)."""
    import datasets

    base = rows_path.parent
    records, video = [], False
    for k, line in enumerate(rows_path.read_text().splitlines()):
        r = json.loads(line)
        rec: dict[str, Any] = {
            "data_source": "rollplex_peers",
            "prompt": [{"role": "user", "content": r["problem"]}],
            "reward_model": {"style": "rule", "ground_truth": str(r["answer"])},
            "extra_info": {"index": k},
        }
        if r.get("images"):
            rec["images"] = [{"bytes": _png(base / p)} for p in r["images"]]
        if r.get("videos"):
            video = True
            frames = r["videos"][0]
            rec["videos"] = [{"video": [f"file://{(base / p).resolve()}" for p in frames]}]
        records.append(rec)
    path = out / "train.parquet"
    datasets.Dataset.from_list(records).to_parquet(str(path))
    return path, video


def _png(path: Path) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.open(path).convert("RGB").save(buf, format="PNG")
    return buf.getvalue()


def overrides(args: argparse.Namespace, s: PeerSettings, data: Path, video: bool) -> list[str]:
    micro = min(args.micro_batch, s.prompts_per_step * s.group_size)
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={s.prompts_per_step}",
        f"data.max_prompt_length={args.max_prompt_length}",
        f"data.max_response_length={s.max_new_tokens}",
        "data.filter_overlong_prompts=False",
        "data.truncation=error",
        "data.image_key=images",
        *(["data.video_key=videos"] if video else []),
        f"data.seed={s.seed}",
        f"actor_rollout_ref.model.path={args.model}",
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        f"actor_rollout_ref.actor.optim.lr={s.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={s.prompts_per_step}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.kl_loss_coef={s.kl_coef}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0",
        f"actor_rollout_ref.actor.fsdp_config.param_offload={args.offload}",
        f"actor_rollout_ref.actor.fsdp_config.optimizer_offload={args.offload}",
        "actor_rollout_ref.ref.fsdp_config.param_offload=True",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.vllm_memory}",
        "actor_rollout_ref.rollout.free_cache_engine=True",
        "actor_rollout_ref.rollout.enforce_eager=False",
        f"actor_rollout_ref.rollout.n={s.group_size}",
        f"actor_rollout_ref.rollout.temperature={s.temperature}",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"custom_reward_function.path={HERE / 'verl_reward.py'}",
        "custom_reward_function.name=compute_score",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={s.steps}",
        "trainer.total_epochs=1000",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.critic_warmup=0",
        "trainer.logger=['console','file']",
        "trainer.project_name=rollplex_peers",
        f"trainer.experiment_name={args.shape}_{args.workload}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    PeerSettings.add_inputs(ap)
    ap.add_argument("--vllm-memory", type=float, default=0.5)  # verl's default
    ap.add_argument("--offload", choices=["True", "False"], default="False",
                    help="actor parameter + optimizer offload (verl's memory option)")  # fmt: skip
    ap.add_argument("--max-prompt-length", type=int, default=20480)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--out", type=Path, required=True)
    PeerSettings.add_arguments(ap)
    args = ap.parse_args()
    s = PeerSettings.from_arguments(args)
    work = args.out.parent / f"verl_{args.shape}_{args.workload}"
    work.mkdir(parents=True, exist_ok=True)
    data, video = to_parquet(args.data, work)
    metrics_path = work / "metrics.jsonl"
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(metrics_path)}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides(args, s, data, video)]
    (work / "command.txt").write_text(" ".join(cmd) + "\n")
    done = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
    (work / "log.txt").write_text(done.stdout + done.stderr)
    steps = [json.loads(x)["data"] for x in metrics_path.read_text().splitlines()] if (
        metrics_path.is_file()) else []  # fmt: skip
    error = None if done.returncode == 0 and steps else (
        (done.stderr.strip().splitlines() or ["verl wrote no metrics"])[-1][:500])  # fmt: skip
    phases: dict[str, list[float]] = {}
    for m in steps:
        for k, v in m.items():
            if k.startswith("timing_s/") and k != "timing_s/step":
                phases.setdefault(k.removeprefix("timing_s/"), []).append(float(v))
    peak = max((float(m.get("perf/max_memory_allocated_gb", 0)) for m in steps), default=0.0)
    result = row(
        "verl",
        "verl hybrid engine",
        args.shape,
        args.workload,
        [float(m["timing_s/step"]) for m in steps if "timing_s/step" in m],
        s.prompts_per_step * s.group_size * s.max_new_tokens,
        phases=phases,
        error=error,
        verl_peak_allocated_bytes=int(peak * 2**30) or None,
        response_length_mean=[m.get("response_length/mean") for m in steps],
        settings=s.as_dict(),
        command=" ".join(cmd),
    )
    write(args.out, result)
    print(json.dumps({k: result[k] for k in ("step_time_s", "tokens_per_s", "error")}))


if __name__ == "__main__":
    main()
