"""PPO checkpoints hold the critic: a PPO run stopped at step k and resumed ends on the same
policy, critic, optimizers and per-step metrics as one that ran straight through; the
critic's AdamW state comes back (not a fresh one); a checkpoint that cannot give a PPO run
its critic is refused before any model is built, naming the file and field, and stays
valid; a GRPO run resumes a PPO checkpoint's policy and leaves its critic."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

import rollplex.jobs.train_loop as train_loop
import rollplex.runtime.compose as compose_module
from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.model import build_model, load_model
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Loss
from rollplex.cli import _conf_dir
from rollplex.jobs.train import run_train
from rollplex.runtime.checkpoint import (
    CRITIC_MASTERS,
    CRITIC_OPTIMIZER,
    CRITIC_WEIGHTS,
    OPTIMIZER_FILE,
    STATE_FILE,
    CheckpointError,
    read_checkpoint,
    restore,
    save_checkpoint,
)
from rollplex.specs import MODEL_PRESETS, AlgoSpec, ModelSpec
from rollplex.specs.run import RunSpec

STEPS, AT = 3, 1  # the straight run's steps; the step the resumed run starts from
# a tiny PPO run on the demo model (conf/train.yaml), small enough for seconds a run
RUN = (
    "algo.lr=1e-3", "algo.critic_lr=1e-3", "train.eval_every=0",
    "train.progress=false", "train.threads=1", "train.max_new_tokens=4",
    "workload.group_size=2", "workload.prompts_per_step=2", "train.checkpoint_every=1",
    f"train.steps={STEPS}",
)  # fmt: skip


@functools.cache
def _spec(*overrides: str, algo: str = "ppo") -> RunSpec:
    given = dict(o.split("=", 1) for o in (f"algo={algo}", *RUN, *overrides))  # last wins
    with initialize_config_dir(config_dir=_conf_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["job=train", *map("=".join, given.items())])
    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    return RunSpec.model_validate(raw)


def _train(out: Path, *overrides: str, algo: str = "ppo") -> list[dict[str, float]]:
    """Run the train job in this process; every step's metrics (all of them, vf_loss too)."""
    seen: list[dict[str, float]] = []
    real = train_loop.metrics_row

    def spy(res):
        seen.append({k: float(v) for k, v in res.metrics.items()})
        return real(res)

    out.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_loop, "metrics_row", spy)
        run_train(_spec(*overrides, algo=algo), out)
    return seen


def _ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:06d}"


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Policy and critic weights, both optimizers' per-parameter state, by name."""
    out = {f"policy.{k}": v for k, v in load_file(folder / "model/model.safetensors").items()}
    out |= {f"critic.{k}": v for k, v in load_file(folder / CRITIC_WEIGHTS).items()}
    for rel in (OPTIMIZER_FILE, CRITIC_OPTIMIZER):
        state = torch.load(folder / rel, weights_only=True)["state"]
        out |= {f"{rel}.{i}.{k}": v for i, st in state.items() for k, v in st.items()}
    return out


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


# PPO as configured, and with the KL in the reward under the adaptive controller, whose
# coefficient moves step to step (kl_horizon=10: visibly, in 3 steps) and feeds the returns
VARIANTS = {
    "ppo": (),
    "adaptive kl_in_reward": (
        "algo.use_reference=true", "algo.kl_coef=0.05", "algo.kl_in_reward=true",
        "algo.kl_ctrl=adaptive", "algo.kl_horizon=10",
    ),
}  # fmt: skip
_RUNS: dict[str, dict[str, Any]] = {}


def _pair_of_runs(tmp_path_factory, variant: str) -> dict[str, Any]:
    """A run of STEPS steps straight through, and one resumed from its step-AT checkpoint
    (which must come out of that untouched); once per variant and module."""
    if variant not in _RUNS:
        root = tmp_path_factory.mktemp("ppo_resume")
        overrides = VARIANTS[variant]
        straight = _train(root / "straight", *overrides)
        start = _ckpt(root / "straight", AT)
        before = _snapshot(start)
        resumed = _train(root / "resumed", *overrides, f"train.resume={start}")
        assert _snapshot(start) == before
        _RUNS[variant] = {"root": root, "straight": straight, "resumed": resumed, "start": start}
    return _RUNS[variant]


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory) -> dict[str, Any]:
    return _pair_of_runs(tmp_path_factory, request.param) | {"variant": request.param}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The plain PPO pair: its step-AT checkpoint is what the refusals below damage."""
    return _pair_of_runs(tmp_path_factory, "ppo")


def test_a_resumed_ppo_run_ends_where_the_straight_one_does(pair):
    runs, root = pair, pair["root"]
    a, b = _tensors(_ckpt(root / "straight", STEPS)), _tensors(_ckpt(root / "resumed", STEPS))
    assert a.keys() == b.keys() and any(k.startswith("critic.lm_head") for k in a)
    assert [k for k in a if not torch.equal(a[k], b[k])] == []  # bitwise
    # and the run moved them: the critic trained, its AdamW counted every step
    first = _tensors(runs["start"])
    assert not torch.equal(first["critic.lm_head.weight"], a["critic.lm_head.weight"])
    steps = {float(v) for k, v in a.items() if k.startswith(CRITIC_OPTIMIZER) and "step" in k}
    assert steps == {float(STEPS)}
    for run in ("straight", "resumed"):
        state = json.loads((_ckpt(root / run, STEPS) / STATE_FILE).read_text())
        assert state["critic_version"] == state["version"] == STEPS
        adaptive = pair["variant"] == "adaptive kl_in_reward"
        assert ("reward_kl_coef" in state) == adaptive  # kept only where it moves


def test_the_steps_after_the_resume_log_the_same_metrics(pair):
    """Every metric a step reports (no timings among them): the critic's values, returns
    and value loss, the policy's loss, ratio and entropy, the reward KL's coefficient, to
    the bit."""
    straight, resumed = pair["straight"], pair["resumed"]
    assert len(straight) == STEPS and len(resumed) == STEPS - AT
    assert {"vf_loss", "values_mean", "returns_mean", "pg_loss"} <= straight[0].keys()
    assert straight[AT:] == resumed
    assert straight[AT]["values_mean"] != straight[0]["values_mean"]  # the critic moved
    coefs = [row.get("reward_kl_coef") for row in straight]
    assert len(set(coefs)) == (STEPS if pair["variant"] == "adaptive kl_in_reward" else 1)


def _critic_step(critic: TorchCritic, k: int) -> None:
    """A fixed loss per step index k: the same gradients in every run."""
    gen = torch.Generator().manual_seed(100 + k)
    loss = torch.stack(
        [(p.float() * torch.randn(p.shape, generator=gen)).sum() for p in critic.params]
    ).sum()
    critic.optimizer_step(critic.backward(Loss(loss, {})))


TINY = MODEL_PRESETS["tiny"]
# the critic's own vision tower (trained) and embeddings that the policy ties to its head
MODELS = {
    "frozen vision": TINY,
    "trained vision, tied": TINY.model_copy(
        update={"trainable_vision": True, "tie_word_embeddings": True}
    ),
}


def _pair(dtype: torch.dtype, spec: ModelSpec, seed: int = 0) -> tuple[TorchTrainer, TorchCritic]:
    algo = AlgoSpec(lr=1e-5, critic_lr=1e-5)  # bf16: most updates live in the masters
    trainer = TorchTrainer(build_model(spec, seed=seed).to(dtype), spec, algo)
    return trainer, TorchCritic(build_critic_model(trainer.model, spec, seed), spec, algo)


def _critic_state(critic: TorchCritic) -> dict[str, torch.Tensor]:
    out = {f"w.{n}": p.detach().clone() for n, p in critic.named}
    if critic.masters is not None:
        out |= {f"m.{n}": t.clone() for n, t in critic.masters.state_dict().items()}
    for i, st in critic.optimizer.state_dict()["state"].items():
        out |= {f"o.{i}.{k}": v.clone() for k, v in st.items()}
    return out


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_critics_optimizer_state_round_trips(tmp_path, dtype, model):
    """The critic's moments, step counts, masters (bf16) and version come back exactly, and
    its next steps are the uninterrupted critic's; a fresh AdamW would not give them."""
    spec = MODELS[model]
    trainer, critic = _pair(dtype, spec)
    vision = [n for n, _ in critic.named if ".visual." in f".{n}"]
    assert bool(vision) == spec.trainable_vision  # a frozen tower is the policy's, unsaved
    for k in range(2):
        _critic_step(critic, k)
    folder = save_checkpoint(tmp_path, 2, trainer, spec, seed=0, critic=critic)
    assert (folder / CRITIC_MASTERS).exists() == (dtype == torch.bfloat16)
    saved = _critic_state(critic)
    for k in range(2, 4):
        _critic_step(critic, k)
    straight = _critic_state(critic)

    other_trainer, resumed = _pair(dtype, spec, seed=1)  # other weights: all from the checkpoint
    assert resumed.optimizer.state_dict()["state"] == {}
    restore(other_trainer, read_checkpoint(folder, spec, seed=0, critic=True), resumed)
    assert resumed.counter.n == 2
    got = _critic_state(resumed)
    assert got.keys() == saved.keys() and all(torch.equal(got[k], saved[k]) for k in saved)
    moments = [v for k, v in got.items() if k.endswith("exp_avg_sq")]
    assert moments and all(bool(m.abs().sum() > 0) for m in moments)  # not reset to zero
    for k in range(2, 4):
        _critic_step(resumed, k)
    assert all(torch.equal(straight[k], v) for k, v in _critic_state(resumed).items())

    fresh_trainer, fresh = _pair(dtype, spec, seed=1)  # the same weights, a fresh optimizer
    ckpt = read_checkpoint(folder, spec, seed=0, critic=True)
    ckpt.critic.optimizer = fresh.optimizer.state_dict()
    restore(fresh_trainer, ckpt, fresh)
    for k in range(2, 4):
        _critic_step(fresh, k)
    drifted = _critic_state(fresh)
    assert any(not torch.equal(straight[k], drifted[k]) for k in drifted if k.startswith("w."))


def _rehash(folder: Path, rel: str) -> None:
    state = folder / STATE_FILE
    raw = json.loads(state.read_text())
    raw["files"][rel] = hashlib.sha256((folder / rel).read_bytes()).hexdigest()
    state.write_text(json.dumps(raw))


def _edit_state(folder: Path, edit) -> None:
    state = folder / STATE_FILE
    raw = json.loads(state.read_text())
    edit(raw)
    state.write_text(json.dumps(raw))


def _damage(folder: Path, what: str) -> None:
    if what == "no critic_version":  # a checkpoint written before PPO kept its critic
        _edit_state(folder, lambda raw: raw.pop("critic_version"))
        shutil.rmtree(folder / "critic")
        _edit_state(folder, lambda raw: [raw["files"].pop(k) for k in list(raw["files"])
                                         if k.startswith("critic/")])  # fmt: skip
    elif what == "unlisted optimizer":
        _edit_state(folder, lambda raw: raw["files"].pop(CRITIC_OPTIMIZER))
    elif what == "flipped weights":  # not rehashed: the checksum catches it
        data = bytearray((folder / CRITIC_WEIGHTS).read_bytes())
        data[-3] ^= 0xFF
        (folder / CRITIC_WEIGHTS).write_bytes(bytes(data))
    elif what == "weights missing the head":
        weights = load_file(folder / CRITIC_WEIGHTS)
        save_file({k: v for k, v in weights.items() if "lm_head" not in k}, folder / CRITIC_WEIGHTS)
        _rehash(folder, CRITIC_WEIGHTS)
    elif what == "moment shape":
        opt = torch.load(folder / CRITIC_OPTIMIZER, weights_only=True)
        last = max(opt["state"])  # the value head's bias, shape (1,)
        opt["state"][last]["exp_avg"] = torch.zeros(2)
        torch.save(opt, folder / CRITIC_OPTIMIZER)
        _rehash(folder, CRITIC_OPTIMIZER)


READ_TIME = ("no critic_version", "unlisted optimizer", "flipped weights")


@pytest.mark.parametrize(
    ("what", "message"),
    [
        (
            "no critic_version",
            rf"{STATE_FILE}: no 'critic_version': the checkpoint holds no critic",
        ),
        ("unlisted optimizer", rf"{STATE_FILE}: 'files' lacks '{CRITIC_OPTIMIZER}'"),
        ("flipped weights", rf"{CRITIC_WEIGHTS}: sha256 differs"),
        ("weights missing the head", rf"{CRITIC_WEIGHTS}: does not fit .*no weight for lm_head"),
        ("moment shape", rf"{CRITIC_OPTIMIZER}: does not fit .*'exp_avg' has shape \(2,\)"),
    ],
)
def test_a_checkpoint_that_cannot_give_ppo_its_critic_is_refused(runs, tmp_path, what, message):
    """Refused with one line naming the file and field, the checkpoint untouched; the ones
    found by reading are refused before any model is built."""
    bad = tmp_path / runs["start"].name
    shutil.copytree(runs["start"], bad)
    _damage(bad, what)
    before = _snapshot(bad)
    built: list[str] = []
    real = compose_module.compose
    with pytest.MonkeyPatch.context() as mp:  # how far the run got before the refusal
        mp.setattr(compose_module, "compose", lambda *a, **k: built.append(1) or real(*a, **k))
        out = tmp_path / "out"
        out.mkdir()
        with pytest.raises(CheckpointError, match=message) as e:
            run_train(_spec(f"train.resume={bad}"), out)
    assert "\n" not in str(e.value)
    # what reading finds stops the run before any model; what only loading can find, after
    assert len(built) == (0 if what in READ_TIME else 1)
    assert not (out / "checkpoints").exists() and _snapshot(bad) == before


def test_a_grpo_checkpoint_is_refused_for_ppo_and_stays_valid(runs, tmp_path):
    """PPO cannot resume a GRPO run's checkpoint (it holds no critic): refused before any
    model is built; the checkpoint is untouched and a GRPO run still resumes from it."""
    grpo = runs["root"] / "grpo"
    _train(grpo, "train.steps=1", algo="grpo_demo")
    ckpt = _ckpt(grpo, 1)
    assert "critic_version" not in json.loads((ckpt / STATE_FILE).read_text())
    assert not (ckpt / "critic").exists()
    before = _snapshot(ckpt)
    (tmp_path / "refused").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compose_module, "compose", lambda *a, **k: pytest.fail("built"))
        with pytest.raises(CheckpointError, match=rf"{ckpt / STATE_FILE}: no 'critic_version'"):
            run_train(_spec(f"train.resume={ckpt}"), tmp_path / "refused")
    assert _snapshot(ckpt) == before
    again = _train(tmp_path / "grpo_again", "train.steps=2", f"train.resume={ckpt}",
                   algo="grpo_demo")  # fmt: skip
    assert len(again) == 1


def test_a_grpo_run_resumes_a_ppo_checkpoints_policy_and_leaves_its_critic(runs, tmp_path, caplog):
    """The policy, its optimizer and the RNGs are the checkpoint's; the critic is PPO's
    alone, so a GRPO run does not read it (a log line says so) and writes none."""
    start = runs["start"]
    pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = train_loop._restore

    def restored(run, ckpt):
        real(run, ckpt)
        trainer = run.backend.trainer
        saved = load_model(start / "model", spec=trainer.spec)
        pairs.extend(
            (p.detach().clone(), q.detach())
            for p, q in zip(trainer.model.parameters(), saved.parameters(), strict=True)
        )
        steps = {float(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
        assert steps == {float(AT)} and run.backend.critic is None

    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.INFO):
        mp.setattr(train_loop, "_restore", restored)
        rows = _train(
            tmp_path / "grpo", f"train.steps={AT + 1}", f"train.resume={start}", algo="grpo_demo"
        )
    assert len(rows) == 1 and "the checkpoint's critic/ is not used" in caplog.text
    assert pairs and all(torch.equal(p, q) for p, q in pairs)
    written = _ckpt(tmp_path / "grpo", AT + 1)
    assert not (written / "critic").exists()
    assert "critic_version" not in json.loads((written / STATE_FILE).read_text())
