"""`rollplex eval` scores a checkpoint the way its train job scored it: a short demo run
(easy-VQA, one-token answers, a seed and a template off their defaults), then `eval` on its
last checkpoint with no generation setting given reproduces the last held-out figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.jobs.cli_run import Result, rollplex_here, rollplex_in_process, torch_settings_kept

STEPS = 40  # at lr 3e-3 the demo answers one word by then: accuracy off 0
TEMPLATE = "data.template='{problem} One word.'"


@pytest.fixture
def eval_here(monkeypatch, capsys):
    """`rollplex eval` through `rollplex.cli.main` in this process (no interpreter start-up
    and imports: ~4 s a run); the torch settings the job makes (the run's one thread,
    determinism) are undone after."""

    def run(out: Path, *overrides: str) -> Result:
        return rollplex_here(out.parent, monkeypatch, capsys, "eval", *overrides,
                             f"hydra.run.dir={out}")  # fmt: skip

    with torch_settings_kept():
        yield run


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> dict:
    run = tmp_path_factory.mktemp("eval") / "train"
    done = rollplex_in_process(
        run.parent, "train", f"hydra.run.dir={run}", f"train.steps={STEPS}",
        f"train.eval_every={STEPS}", "train.eval_prompts=48", f"train.checkpoint_every={STEPS}",
        "train.progress=false", "algo.lr=3e-3", "seed=1", TEMPLATE,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    return summary | {"run": run}


@pytest.mark.slow  # the module's 40-step demo run: ~15 s
def test_eval_of_the_last_checkpoint_reproduces_the_last_held_out_figure(
    demo_run, eval_here, tmp_path
):
    out = tmp_path / "eval"
    done = eval_here(out, f"model.path={demo_run['last_checkpoint']}")
    assert done.returncode == 0, done.stderr[-3000:]
    scored = json.loads((out / "summary.json").read_text())
    assert scored["settings_from"] == str(demo_run["run"] / "config.json")
    assert scored["max_new_tokens"] == 1 and scored["prompts"] == demo_run["eval_prompts"] == 48
    # the same prompts (seed 1's order) and the same scoring: equal, not approximately
    assert scored["majority_accuracy"] == demo_run["majority_accuracy"]
    assert scored["accuracy"] == demo_run["eval_accuracy_last"]
    # off 0: the figure a mismatched cap (eval's old 8 tokens after a 1-token run) zeroes
    assert demo_run["eval_accuracy_last"] > 0
    assert scored["examples"] == demo_run["eval_examples"]


@pytest.mark.slow
def test_the_command_line_still_overrides_what_the_run_decided(demo_run, eval_here, tmp_path):
    out = tmp_path / "eval"
    done = eval_here(
        out, f"model.path={demo_run['last_checkpoint']}",
        "eval.max_new_tokens=3", "eval.prompts=5", "seed=0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    scored = json.loads((out / "summary.json").read_text())
    assert scored["max_new_tokens"] == 3 and scored["prompts"] == 5
    problems = [e[0] for e in scored["examples"]]
    assert problems != [e[0] for e in demo_run["eval_examples"]][:5]  # seed 0's order


@pytest.mark.slow
def test_what_eval_takes_from_the_run_and_what_the_command_line_keeps(demo_run):
    """The run's template, seed, data and generation cap, except the keys the command
    line named (unit level: no model runs)."""
    from rollplex.jobs.eval import settings_from_run
    from rollplex.specs.run import RunSpec

    config = demo_run["run"] / "config.json"
    run = RunSpec.model_validate_json(config.read_text())
    data = run.data.model_copy(update={"template": "{problem}"})
    mine = run.model_copy(update={"job": "eval", "seed": 0, "data": data})
    inherited = settings_from_run(mine, config, set())
    assert inherited.seed == 1 and inherited.data.template == "{problem} One word."
    assert (inherited.eval.max_new_tokens, inherited.eval.prompts) == (1, 48)
    kept = settings_from_run(mine, config, {"seed", "data.template", "model.path"})
    assert kept.seed == 0 and kept.data.template == "{problem}"
    assert kept.model == inherited.model == run.model  # no model.path: the run's preset
    alone = settings_from_run(mine, None, set())  # a folder no rollplex run wrote
    assert (alone.eval.max_new_tokens, alone.eval.prompts) == (8, 200)


@pytest.mark.slow
def test_the_run_logs_the_baseline_beside_accuracy_and_memory_in_gib(demo_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(demo_run["run"] / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"eval/accuracy", "eval/majority_accuracy", "memory/peak_resident_gib"} <= tags
    assert "memory/peak_resident_bytes" not in tags
    (last,) = [e.value for e in events.Scalars("eval/majority_accuracy") if e.step == STEPS]
    assert last == pytest.approx(demo_run["majority_accuracy"])
    peaks = [e.value for e in events.Scalars("memory/peak_resident_gib")]
    assert len(peaks) == STEPS and 0 < min(peaks) <= max(peaks) < 1  # the tiny model: MiB


@pytest.mark.slow
def test_sampled_answers_give_mean_and_pass_at_n_of_the_trained_checkpoint(
    demo_run, eval_here, tmp_path
):
    """eval.samples=8 at temperature 1: eight answers a prompt from the engine; pass@8 is
    at least mean@8, and the prompts are the greedy evaluation's 48."""
    out = tmp_path / "eval"
    done = eval_here(
        out, f"model.path={demo_run['last_checkpoint']}", "eval.samples=8", "eval.temperature=1.0"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    scored = json.loads((out / "summary.json").read_text())
    assert (scored["samples"], scored["temperature"], scored["prompts"]) == (8, 1.0, 48)
    assert 0 < scored["accuracy"] <= scored["pass_at_n"] <= 1
    assert scored["pass_at_n"] > scored["accuracy"]  # answers differ: some prompts half right
    assert "mean@8; pass@8" in done.stdout
