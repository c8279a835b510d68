"""Sources: seeded epochs that resume exactly, disjoint splits, checkable synthetic answers."""

from __future__ import annotations

import pytest

from rollplex.data import DataError, PromptSource, Sample, build_source
from rollplex.data.motion import DIRECTIONS, MotionTask
from rollplex.data.shapes import BACKGROUND, COUNT_WORDS, PALETTE
from rollplex.specs.data import DataSpec


def _key(s: Sample) -> tuple:
    frames = s.video or ()
    return (s.uid, s.problem, s.answer, *(im.tobytes() for im in (*s.images, *frames)))


@pytest.mark.parametrize("source", ["synthetic", "synthetic_video"])
def test_step_k_is_the_same_after_a_resume(source: str) -> None:
    spec = DataSpec(source=source, max_rows=7)
    run = build_source(spec, "train", seed=3, frames=8)
    seen = [[_key(s) for s in run.batch(k, 3)] for k in range(6)]  # crosses two epochs
    resumed = build_source(spec, "train", seed=3, frames=8)  # a fresh process, say
    assert [_key(s) for s in resumed.batch(4, 3)] == seen[4]
    assert [_key(s) for s in resumed.batch(1, 3)] == seen[1]
    other = build_source(spec, "train", seed=4, frames=8)
    assert [s.uid for k in range(3) for s in other.batch(k, 3)] != [
        u[0] for k in range(3) for u in seen[k]
    ]


def test_each_epoch_is_a_fresh_permutation() -> None:
    src = build_source(DataSpec(max_rows=5), "train", seed=0)
    assert isinstance(src, PromptSource) and len(src) == 5
    uids = [s.uid for k in range(5) for s in src.batch(k, 2)]  # 10 rows = epochs 0 and 1
    epochs = [uids[:5], uids[5:]]
    assert all(sorted(e) == [f"synthetic:train:{i}" for i in range(5)] for e in epochs)
    assert [src.epoch(k, 2) for k in range(6)] == [0, 0, 0, 1, 1, 2]
    orders = {tuple(s.uid for k in range(5) for s in src.batch(k, 1))} | {
        tuple(s.uid for k in range(5, 10) for s in src.batch(k, 1))
    }
    assert len(orders) == 2  # epoch 1 is not epoch 0 again
    with pytest.raises(ValueError, match="step"):
        src.batch(-1, 2)


@pytest.mark.parametrize("source", ["synthetic", "synthetic_video"])
def test_train_and_test_splits_are_disjoint(source: str) -> None:
    spec = DataSpec(source=source, max_rows=50, eval_max_rows=20)
    train = build_source(spec, "train", 0, frames=8)
    test = build_source(spec, "test", 0, frames=8)
    assert (len(train), len(test)) == (50, 20)
    assert {s.uid.split(":")[1] for s in test.batch(0, 20)} == {"test"}
    tr = {_key(s)[1:] for s in train.batch(0, 50)}
    assert not tr & {_key(s)[1:] for s in test.batch(0, 20)}
    with pytest.raises(DataError, match="'valid'"):
        build_source(spec, "valid", 0)


def test_synthetic_images_are_rgb_and_answers_match_the_generator() -> None:
    src = build_source(DataSpec(questions=("colour",)), "train", 1)
    for s in src.batch(0, 8):
        (image,) = s.images
        assert image.mode == "RGB" and image.size == (84, 84) and s.video is None
        colours = {c for _, c in image.getcolors(1 << 16)} - {BACKGROUND}
        assert colours == {PALETTE[s.answer]}


def _blobs(frame) -> list[tuple[float, float]]:
    """Centroids of the 4-connected non-background components of one frame."""
    w, h = frame.size
    px, seen, out = frame.load(), set(), []
    for start in ((x, y) for y in range(h) for x in range(w)):
        if start in seen or px[start] == BACKGROUND:
            continue
        stack, pts = [start], []
        seen.add(start)
        while stack:
            x, y = stack.pop()
            pts.append((x, y))
            for n in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if 0 <= n[0] < w and 0 <= n[1] < h and n not in seen and px[n] != BACKGROUND:
                    seen.add(n)
                    stack.append(n)
        out.append((sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts)))
    return out


@pytest.mark.parametrize("frames", [8, 16])
def test_video_answers_can_be_read_back_from_the_frames(frames: int) -> None:
    src = build_source(DataSpec(source="synthetic_video"), "train", 5, frames=frames)
    kinds = set()
    for s in src.batch(0, 24):
        assert s.images == () and len(s.video) == frames
        assert all(f.mode == "RGB" and f.size == (84, 84) for f in s.video)
        first, last = _blobs(s.video[0]), _blobs(s.video[-1])
        if s.answer in DIRECTIONS:
            kinds.add("direction")
            (a,), (b,) = first, last
            dx, dy = b[0] - a[0], b[1] - a[1]
            read = ("right" if dx > 0 else "left") if abs(dx) > abs(dy) else "down"
            read = "up" if abs(dy) > abs(dx) and dy < 0 else read
            assert read == s.answer, s.uid
        else:
            kinds.add("count")
            assert all(COUNT_WORDS[len(_blobs(f)) - 1] == s.answer for f in s.video), s.uid
    assert kinds == {"direction", "count"}


def test_video_task_is_a_pure_function_of_seed_and_index() -> None:
    a, b = MotionTask(9, frames=12).sample(77), MotionTask(9, frames=12).sample(77)
    assert [f.tobytes() for f in a.frames] == [f.tobytes() for f in b.frames]
    assert a.answer == b.answer and a.tracks == b.tracks
    assert MotionTask(10, frames=12).sample(77).tracks != a.tracks
    with pytest.raises(DataError, match="frames"):
        build_source(DataSpec(source="synthetic_video"), "train", 0, frames=1)
    with pytest.raises(DataError, match="unknown video question kinds"):
        build_source(DataSpec(source="synthetic_video", questions=("colour",)), "train", 0)


def test_easyvqa_splits() -> None:
    import easy_vqa

    spec = DataSpec(source="easyvqa")
    train, test = build_source(spec, "train", 0), build_source(spec, "test", 0)
    assert (len(train), len(test)) == (38_575, 9_673)
    answers = set(easy_vqa.get_answers())
    for s in train.batch(2, 4) + test.batch(0, 4):
        assert s.answer in answers and s.problem.endswith("?")
        assert s.images[0].mode == "RGB" and s.images[0].size == (64, 64)
    assert build_source(spec, "test", 0).batch(0, 4)[0].uid.startswith("easyvqa:test:")
    small = build_source(DataSpec(source="easyvqa", max_rows=10), "train", 0)
    assert len(small) == 10 and {s.uid for s in small.batch(0, 10)} == {
        f"easyvqa:train:{i}" for i in range(10)
    }


@pytest.mark.parametrize(
    ("frames", "size", "why"),
    [(1, 84, "at least 2 frames, got 1"), (64, 56, "image_size 56 too small for 64")],
)
def test_a_video_workload_the_task_cannot_draw_names_the_fields_to_change(frames, size, why):
    spec = DataSpec(source="synthetic_video", image_size=size)
    with pytest.raises(DataError) as err:
        build_source(spec, "train", 0, frames=frames)
    assert f"workload.frames={frames}, data.image_size={size}" in str(err.value)
    assert why in str(err.value)
