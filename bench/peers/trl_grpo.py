"""TRL's GRPOTrainer on the peers' shared prompts and model folder, timed per step.

    python bench/peers/trl_grpo.py --model <folder> --data /tmp/peers/easyvqa/train.jsonl \
        --shape qwen2_5_vl_7b --workload easyvqa --steps 6 --out row.json [--vllm]

The settings mirror `rollplex train`'s (bench/peers/settings.py): G completions per prompt,
P prompts per step and one optimizer step per generation (on-policy), AdamW at a constant
learning rate, a k3 KL loss to the reference at `beta`, token-mean aggregation (TRL's
`dapo`), rewards scaled by the group's std, `max_new_tokens` with EOS ignored. Memory
settings are TRL's own for one GPU: gradient checkpointing, bf16, and with `--vllm` its
colocated vLLM engine at `--vllm-memory` of the GPU, asleep while training.
TRL's GRPOTrainer takes images only (no video column), so video workloads record an error.
With `--eval-every N` it also logs greedy held-out accuracy (the rollplex reward) for
bench/peers/accuracy.py.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from peer_row import DevicePeak, row, write  # bench/peers/ is on sys.path as the script's folder
from PIL import Image
from settings import PeerSettings

from rollplex.data.rewards import exact_match
from rollplex.data.sample import Sample


def load_rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if any(r.get("videos") for r in rows):
        raise ValueError("TRL 1.16's GRPOTrainer takes image prompts only (no video column)")
    return rows


def as_trl_dataset(rows: list[dict[str, Any]], base: Path):
    """Conversational prompts with the image first (where the rows put '<image>')."""
    import datasets

    prompts, images, answers = [], [], []
    for r in rows:
        text = r["problem"].replace("<image>", "")
        content = [{"type": "image"} for _ in r["images"]] + [{"type": "text", "text": text}]
        prompts.append([{"role": "user", "content": content}])
        images.append([Image.open(base / p).convert("RGB") for p in r["images"]])
        answers.append(str(r["answer"]))
    return datasets.Dataset.from_dict({"prompt": prompts, "images": images, "answer": answers})


def reward_exact_match(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """rollplex's exact_match, so every framework is scored by the same function."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [exact_match(t, Sample("trl", "", a)) for t, a in zip(texts, answer, strict=True)]


def greedy_accuracy(model, processor, rows, base: Path, max_new_tokens: int) -> float:
    """Held-out greedy accuracy with the same reward as training (rollplex's exact match)."""
    tok = processor.tokenizer
    side, tok.padding_side = tok.padding_side, "left"
    correct = 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(rows), 32):
            chunk = rows[start : start + 32]
            chats = [
                [{"role": "user", "content": [{"type": "image"}] * len(r["images"])
                  + [{"type": "text", "text": r["problem"].replace("<image>", "")}]}]
                for r in chunk
            ]  # fmt: skip
            texts = [processor.apply_chat_template(c, add_generation_prompt=True) for c in chats]
            images = [[Image.open(base / p).convert("RGB") for p in r["images"]] for r in chunk]
            inputs = processor(text=texts, images=images, return_tensors="pt", padding=True)
            inputs = inputs.to(model.device)
            # TRL samples with the visual pad tokens suppressed (GRPOTrainer sets
            # suppress_tokens); its scored logprobs never see that, so the trained policy's
            # argmax drifts onto <|image_pad|>. Greedy eval generates as TRL's rollout does.
            out = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                suppress_tokens=[model.config.image_token_id, model.config.video_token_id],
            )
            answers = tok.batch_decode(
                out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
            )
            if start == 0:
                print("trl greedy answers:", answers[:8], flush=True)
            correct += sum(
                exact_match(a, Sample("eval", "", str(r["answer"])))
                for a, r in zip(answers, chunk, strict=True)
            )
    tok.padding_side = side
    model.train(was_training)
    return correct / len(rows)


def micro_batch(args: argparse.Namespace, s: PeerSettings) -> int:
    """Completions per forward and backward: at most the step's."""
    return min(s.prompts_per_step * s.group_size, args.micro_batch)


def schedule_name(args: argparse.Namespace, s: PeerSettings) -> str:
    """How TRL generated, and its micro-batch."""
    mode = "trl+vllm colocate" if args.vllm else "trl generate"
    return f"{mode}, micro-batch {micro_batch(args, s)}"


def run(args: argparse.Namespace, s: PeerSettings) -> dict[str, Any]:
    from transformers import AutoConfig, AutoProcessor, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    phases: dict[str, list[float]] = {}
    original = profiling.ProfilingContext._log_metrics

    def keep(self, duration: float) -> None:  # TRL logs its phases to wandb only
        phases.setdefault(self.name.split("/")[-1], []).append(duration)
        original(self, duration)

    profiling.ProfilingContext._log_metrics = keep
    cuda = torch.cuda.is_available()
    rows = load_rows(args.data)
    dataset = as_trl_dataset(rows, args.data.parent)
    eval_rows = load_rows(args.eval_data) if args.eval_data else []
    processor = AutoProcessor.from_pretrained(args.model)
    model_config = AutoConfig.from_pretrained(args.model)
    batch = s.prompts_per_step * s.group_size
    micro = micro_batch(args, s)
    # Throughput runs ignore EOS so every framework generates the same tokens; accuracy runs
    # keep it (a model that never learns to stop would be scored differently from training).
    gen_kwargs: dict[str, Any] = (
        ({"ignore_eos": True} if args.vllm else {"min_new_tokens": s.max_new_tokens})
        if args.ignore_eos
        else {}
    )
    if args.vllm:  # as TRL's transformers path suppresses the image pad (see greedy_accuracy):
        # a sampled pad token makes the training forward count one more image token than
        # the image has features, and the step fails (random weights sample it in 3 steps)
        pads = [getattr(model_config, k) for k in ("image_token_id", "video_token_id")]
        gen_kwargs["logit_bias"] = {int(i): -100.0 for i in pads if i is not None}
    config = GRPOConfig(
        output_dir=str(args.out.parent / "trl_output"),
        max_steps=s.steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=batch // micro,  # one optimizer step per generation
        num_generations=s.group_size,
        max_completion_length=s.max_new_tokens,
        generation_kwargs=gen_kwargs,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        optim="adamw_torch",
        beta=s.kl_coef,
        epsilon=0.2,
        num_iterations=1,
        loss_type="dapo",  # token-mean over the batch: rollplex's loss_agg_mode=token-mean
        scale_rewards="group",
        gradient_checkpointing=cuda,  # TRL's one-GPU memory setting
        bf16=cuda,
        use_cpu=not cuda,
        model_init_kwargs={"dtype": torch.bfloat16 if cuda else torch.float32},
        use_vllm=args.vllm,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=args.vllm_memory,
        vllm_enable_sleep_mode=args.vllm,
        seed=s.seed,
        data_seed=s.seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    step_times: list[float] = []
    accuracy: list[list[float]] = []
    state = {"t0": 0.0, "train_s": 0.0}

    class Timing(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            state["t0"] = time.perf_counter()

        def on_step_end(self, _args, st, _control, model=None, **__: Any) -> None:
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - state["t0"]
            step_times.append(dt)
            state["train_s"] += dt
            print(f"trl step {st.global_step}: {dt:.3f} s", flush=True)
            if eval_rows and args.eval_every and st.global_step % args.eval_every == 0:
                acc = greedy_accuracy(
                    model, processor, eval_rows, args.eval_data.parent, s.max_new_tokens
                )
                accuracy.append([st.global_step, state["train_s"], acc])
                print(f"trl step {st.global_step}: held-out accuracy {acc:.3f}", flush=True)

    trainer = GRPOTrainer(
        model=str(args.model),
        reward_funcs=reward_exact_match,
        args=config,
        train_dataset=dataset,
        processing_class=processor,
        callbacks=[Timing()],
    )
    if eval_rows and args.eval_every:
        acc = greedy_accuracy(
            trainer.model, processor, eval_rows, args.eval_data.parent, s.max_new_tokens
        )
        accuracy.append([0, 0.0, acc])
    with DevicePeak() as peak:
        trainer.train()
    logged = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    mean_len = logged[-1]["completions/mean_length"] if logged else None
    return row(
        "trl",
        schedule_name(args, s),
        args.shape,
        args.workload,
        step_times,
        batch * s.max_new_tokens,
        peak_device_bytes=peak.peak,
        phases=phases,
        completion_mean_length=mean_len,
        accuracy=accuracy,
        trl_log=[{k: v for k, v in h.items() if isinstance(v, int | float)} for h in logged],
        settings=s.as_dict(),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    PeerSettings.add_inputs(ap)
    ap.add_argument("--eval-data", type=Path)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--vllm", action="store_true", help="TRL's colocated vLLM generation")
    ap.add_argument("--vllm-memory", type=float, default=0.3)
    ap.add_argument(
        "--ignore-eos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="every response runs to max_new_tokens (throughput); --no-ignore-eos for accuracy",
    )
    ap.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    ap.add_argument("--out", type=Path, required=True)
    PeerSettings.add_arguments(ap)
    args = ap.parse_args()
    settings = PeerSettings.from_arguments(args)
    try:
        result = run(args, settings)
    except Exception as err:  # the table records why a peer could not run
        traceback.print_exc()
        result = row("trl", schedule_name(args, settings), args.shape,
                     args.workload, [], 0, error=f"{type(err).__name__}: {err}"[:500])  # fmt: skip
    write(args.out, result)
    print(json.dumps({k: result[k] for k in ("step_time_s", "tokens_per_s", "error")}))


if __name__ == "__main__":
    main()
