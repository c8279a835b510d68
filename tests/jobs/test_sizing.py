"""A train job sized from what the user gave (jobs/sizing.py): the hardware read from a
(fake) device, refusals by name where an explicit `hardware` disagrees with it, GPU-sized
defaults where the command line set none, and the plan's responses from max_new_tokens."""

from __future__ import annotations

import functools

import pytest
from hydra import compose, initialize_config_dir

from rollplex.cli import _conf_dir
from rollplex.jobs.sizing import gpu_defaults, size_train
from rollplex.jobs.validate_run import RunFacts, check_combination
from rollplex.specs import HARDWARE_PRESETS
from rollplex.specs.hardware import GIB, DeviceInfo, gpu_model
from rollplex.specs.role_needs import chosen_needs
from rollplex.specs.run import RunSpec

H200 = DeviceInfo("NVIDIA H200", int(139.8 * GIB), 1)
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 85_031_714_816, 1)
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 85_100_000_000, 8)
ODD = DeviceInfo("NVIDIA GeForce RTX 4090", 24 * GIB, 2)
DEVICES = (H200, H100, A100, ODD)


@functools.cache
def spec_and_keys(*overrides: str) -> tuple[RunSpec, frozenset[str]]:
    """The spec `rollplex train <overrides>` validates, and the keys its command line sets
    (cached: composing costs ~1 s, and a RunSpec is frozen)."""
    with initialize_config_dir(config_dir=_conf_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*overrides, "job=train"])
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    raw.pop("hydra", None)
    keys = frozenset(o.split("=", 1)[0] for o in overrides)
    return RunSpec.model_validate(raw), keys


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: gpu_model(d.name))
@pytest.mark.parametrize("extra", [(), ("model=tiny",), ("algo=ppo", "workload=tiny")])
def test_the_hardware_is_read_from_the_device_when_not_given(device, extra):
    spec, keys = spec_and_keys("train.device=cuda", *extra)
    assert spec.hardware.name == "cpu"  # conf/train.yaml's default, not the user's
    hw = size_train(spec, keys, device).spec.hardware
    assert gpu_model(hw.gpu) == gpu_model(device.name) and hw.num_gpus == 1
    assert hw.hbm_gib <= device.total_gib * 1.02 and hw.hbm_gib > device.total_gib * 0.9
    if device in (H200, H100):  # a GPU with a preset plans with the preset's rates
        preset = HARDWARE_PRESETS["h200" if device is H200 else "h100"]
        assert (hw.name, hw.bf16_tflops, hw.hbm_bandwidth_gbps) == (
            preset.name,
            preset.bf16_tflops,
            preset.hbm_bandwidth_gbps,
        )
    else:
        assert hw.name.startswith("detected-")


def test_an_unknown_gpu_is_planned_with_fallback_rates_and_says_so():
    spec, keys = spec_and_keys("train.device=cuda")
    sized = size_train(spec, keys, ODD)
    assert any("unknown GPU" in n and ODD.name in n for n in sized.notes)


def test_a_smaller_h200_keeps_the_preset_rates_with_its_own_memory():
    small = DeviceInfo("NVIDIA H200", 93 * GIB, 1)
    spec, keys = spec_and_keys("train.device=cuda")
    hw = size_train(spec, keys, small).spec.hardware
    assert hw.name == "h200" and hw.hbm_gib == pytest.approx(93, abs=0.1)
    assert hw.hbm_bandwidth_gbps == HARDWARE_PRESETS["h200"].hbm_bandwidth_gbps


@pytest.mark.parametrize(
    ("given", "device", "named"),
    [
        ("hardware=h200", H100, "H100"),
        ("hardware=cpu", H200, "H200"),
        ("hardware=h800x32", H200, "H200"),
        ("hardware=h200x8", DeviceInfo("NVIDIA H200", int(139.8 * GIB), 2), "2 GPU"),
        ("hardware.hbm_gib=200", H200, "hbm_gib=200"),
        ("hardware.gpu=H100", H200, "hardware.gpu='H100'"),
    ],
)
def test_an_explicit_hardware_that_disagrees_with_the_device_is_refused_by_name(
    given, device, named
):
    spec, keys = spec_and_keys("train.device=cuda", given)
    with pytest.raises(ValueError, match="does not match the device") as err:
        size_train(spec, keys, device)
    assert "hardware=" in str(err.value) and named in str(err.value)


def test_a_hardware_field_given_alone_goes_on_top_of_the_devices():
    spec, keys = spec_and_keys("train.device=cuda", "hardware.hbm_gib=100")
    hw = size_train(spec, keys, H200).spec.hardware
    assert hw.hbm_gib == 100 and hw.gpu == H200.name and hw.name == "h200"


@pytest.mark.parametrize("given", ["hardware=h200", "hardware=h200x8"])
def test_an_explicit_hardware_that_matches_is_kept(given):
    spec, keys = spec_and_keys("train.device=cuda", given)
    eight = DeviceInfo("NVIDIA H200", int(139.8 * GIB), 8)
    assert size_train(spec, keys, eight).spec.hardware == spec.hardware


def test_a_spec_built_in_python_keeps_its_hardware_unless_it_is_the_cpu_default():
    spec, _ = spec_and_keys("train.device=cuda")
    assert gpu_model(size_train(spec, None, H100).spec.hardware.gpu) == gpu_model(H100.name)
    h200, _ = spec_and_keys("train.device=cuda", "hardware=h200")
    assert size_train(h200, None, H200).spec == h200  # nothing else changes without Hydra
    with pytest.raises(ValueError, match="hardware=h200 does not match"):
        size_train(h200, None, H100)


def test_gpu_defaults_fill_only_what_the_command_line_left_unset():
    defaults = gpu_defaults()
    spec, keys = spec_and_keys("train.device=cuda")
    sized = size_train(spec, keys, H200).spec
    assert (
        sized.workload.prompts_per_step
        == defaults["workload.prompts_per_step"]
        != (spec.workload.prompts_per_step)
    )
    assert sized.workload.group_size == defaults["workload.group_size"]
    assert sized.train.max_new_tokens == defaults["train.max_new_tokens"]
    assert sized.backend.vllm.dtype == "bfloat16" != spec.backend.vllm.dtype
    # a key the user gave wins, and a group the user picked keeps its preset's values
    spec, keys = spec_and_keys(
        "train.device=cuda", "workload.group_size=4", "train.max_new_tokens=32"
    )
    sized = size_train(spec, keys, H200).spec
    assert (sized.workload.group_size, sized.train.max_new_tokens) == (4, 32)
    assert sized.workload.prompts_per_step == defaults["workload.prompts_per_step"]
    spec, keys = spec_and_keys("train.device=cuda", "workload=tiny")
    assert size_train(spec, keys, H200).spec.workload.samples_per_step == (
        spec.workload.samples_per_step
    )
    # on CPU the demo's defaults stay
    spec, keys = spec_and_keys()
    sized = size_train(spec, keys, None).spec
    assert sized.workload.samples_per_step == spec.workload.samples_per_step
    assert sized.hardware == spec.hardware


def accept(sized: RunSpec) -> None:
    """validate_run's checks after the sizing, for a spec already sized (one CPU process)."""
    check_combination(sized, chosen_needs(sized.backend), 1, RunFacts())


@pytest.mark.parametrize("device", [None, H200])
@pytest.mark.parametrize("cap", [1, 16, 128, 700])
def test_the_plans_responses_follow_max_new_tokens(device, cap):
    over = ("train.device=cuda",) if device else ()
    spec, keys = spec_and_keys(*over, f"train.max_new_tokens={cap}")
    sized = size_train(spec, keys, device).spec
    r = sized.workload.response_length
    assert (r.distribution, r.mean, r.max) == ("fixed", cap, cap)
    accept(sized)  # no longer refused, whatever the cap


def test_an_explicit_response_length_is_kept_and_a_larger_cap_refused_as_before():
    spec, keys = spec_and_keys("train.max_new_tokens=128", "workload.response_length.max=16")
    sized = size_train(spec, keys, None).spec
    assert sized.workload.response_length == spec.workload.response_length
    with pytest.raises(ValueError, match=r"train\.max_new_tokens=128 exceeds workload"):
        accept(sized)


def test_forced_lengths_keep_the_workloads_distribution():
    """train.response_lengths=workload draws lengths from the workload: not replaced."""
    spec, keys = spec_and_keys("train.response_lengths=workload", "train.max_new_tokens=16")
    assert size_train(spec, keys, None).spec.workload == spec.workload


@pytest.mark.parametrize(
    ("device", "given", "message"),
    [
        (H100, "hardware=h200", "hardware=h200 does not match the device"),
        (None, "hardware=h200", "train.device=cuda: "),  # CPU-only build, or no GPU visible
    ],
)
def test_the_cli_refuses_before_any_work_with_exit_2(
    tmp_path, monkeypatch, capsys, device, given, message
):
    """The command line's own keys reach the sizing: `hardware=h200` is the user's."""
    import sys

    import rollplex.jobs.sizing as sizing
    from rollplex.cli import main

    if device is not None:  # a machine with this GPU: the early device check passes too
        import rollplex.jobs.devices as devices

        monkeypatch.setattr(sizing, "read_device", lambda _: device)
        monkeypatch.setattr(devices, "check_device", lambda *_: None)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main(["train", "train.device=cuda", given, f"hydra.run.dir={run}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (run / "plan.json").exists()
