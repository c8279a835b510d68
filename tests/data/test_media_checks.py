"""MediaChecks (data/media_checks.py): a later build of a source over unchanged files decodes
none of them and sizes every row as the first did; a changed file is decoded again (and a bad
one still refused by row); an unreadable cache costs a decode, never a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from PIL import Image

from rollplex.data import DataError, build_source, media
from rollplex.data.media_checks import MediaChecks
from rollplex.specs.data import DataSpec


@pytest.fixture
def decodes(monkeypatch) -> list[str]:
    """The image and video files decoded, in order."""
    seen: list[str] = []
    image, video = media._decode, media._decode_file

    def count_image(ref, where):
        seen.append(str(ref) if isinstance(ref, Path) else "<bytes>")
        return image(ref, where)

    def count_video(path, where):
        seen.append(str(path))
        return video(path, where)

    monkeypatch.setattr(media, "_decode", count_image)
    monkeypatch.setattr(media, "_decode_file", count_video)
    return seen


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    for i, size in enumerate([(8, 6), (5, 9), (8, 6)]):  # 0 and 2: one video
        Image.new("RGB", size, (30 * i, 0, 0)).save(tmp_path / f"{i}.png")
    gif = [Image.new("RGB", (6, 4), (40 * i, 0, 0)) for i in range(5)]
    gif[0].save(tmp_path / "clip.gif", save_all=True, append_images=gif[1:], duration=40)
    rows = [
        {"problem": "<image> a?", "answer": "a", "images": ["0.png"]},
        {"problem": "<image> <image> b?", "answer": "b", "images": ["1.png", "0.png"]},
        {"problem": "<video> c?", "answer": "c", "videos": ["0.png", "2.png"]},
        {"problem": "<video> d?", "answer": "d", "videos": "clip.gif"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _build(rows_file: Path, cache: Path):
    spec = DataSpec(source="jsonl", path=str(rows_file))
    return build_source(spec, "train", 0, frames=2, checks=MediaChecks.load(cache))


def test_a_second_build_decodes_nothing_and_sizes_every_row_alike(rows_file, tmp_path, decodes):
    cache = tmp_path / "cache" / "media_checks.json"
    first = _build(rows_file, cache)
    assert sorted(Path(p).name for p in decodes) == ["0.png", "1.png", "2.png", "clip.gif"]
    decodes.clear()
    second = _build(rows_file, cache)
    assert decodes == []
    assert second.media == first.media
    assert [m.video_frames for m in second.media] == [0, 0, 2, 5]
    assert second.media[3].video_size == (6, 4)
    # the rows still load their pixels when batched: only the check was skipped
    by_uid = {s.uid: s for s in second.batch(0, 4)}
    assert by_uid["jsonl:train:0"].images[0].size == (8, 6)


def test_a_changed_file_is_decoded_again_and_a_bad_one_refused_by_row(rows_file, tmp_path, decodes):
    cache = tmp_path / "media_checks.json"
    _build(rows_file, cache)
    Image.new("RGB", (3, 3)).save(rows_file.parent / "1.png")
    decodes.clear()
    src = _build(rows_file, cache)
    assert [Path(p).name for p in decodes] == ["1.png"]
    assert src.media[1].image_sizes == ((3, 3), (8, 6))
    (rows_file.parent / "2.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"d\.jsonl row 2 field 'videos' frame 1.*2\.png"):
        _build(rows_file, cache)


def test_a_file_with_the_same_size_and_time_is_taken_as_checked(rows_file, tmp_path, decodes):
    """What the key is (the rule Python's own bytecode cache follows, with nanoseconds)."""
    cache = tmp_path / "media_checks.json"
    _build(rows_file, cache)
    png = rows_file.parent / "0.png"
    st = png.stat()
    png.write_bytes(png.read_bytes()[::-1])  # same length, other bytes
    os.utime(png, ns=(st.st_atime_ns, st.st_mtime_ns))
    decodes.clear()
    _build(rows_file, cache)
    assert decodes == []


@pytest.mark.parametrize("text", ["{not json", '{"format": 99, "files": {}}', "[]"])
def test_an_unreadable_cache_is_checked_again_and_replaced(rows_file, tmp_path, decodes, text):
    cache = tmp_path / "media_checks.json"
    cache.write_text(text)
    _build(rows_file, cache)
    assert len(decodes) == 4
    assert len(json.loads(cache.read_text())["files"]) == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_entries_of_another_shape_are_not_trusted(rows_file, tmp_path, decodes):
    cache = tmp_path / "media_checks.json"
    _build(rows_file, cache)
    data = json.loads(cache.read_text())
    for key in data["files"]:
        data["files"][key] = [*data["files"][key][:2], "8", 6]
    cache.write_text(json.dumps(data))
    decodes.clear()
    _build(rows_file, cache)
    assert len(decodes) == 4


def test_a_write_drops_the_entries_of_files_that_are_gone(rows_file, tmp_path, decodes):
    cache = tmp_path / "media_checks.json"
    _build(rows_file, cache)
    gone = tmp_path / "old"
    gone.mkdir()
    Image.new("RGB", (4, 4)).save(gone / "x.png")
    checks = MediaChecks.load(cache)
    checks.recall(gone / "x.png", 2, lambda: (4, 4))
    checks.save()
    assert len(json.loads(cache.read_text())["files"]) == 5
    (gone / "x.png").unlink()
    (tmp_path / "1.png").touch()  # changed: decoded again, which writes the file
    decodes.clear()
    _build(rows_file, cache)
    assert decodes == [str(tmp_path / "1.png")]
    kept = json.loads(cache.read_text())["files"]
    assert sorted(Path(k).name for k in kept) == ["0.png", "1.png", "2.png", "clip.gif"]


def test_a_cache_that_cannot_be_written_costs_only_the_next_decode(rows_file, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    src = _build(rows_file, blocker / "media_checks.json")  # its folder is a file
    assert len(src.media) == 4
    assert "media checks not kept" in caplog.text


def test_the_splits_of_a_run_share_one_read_and_each_logs_its_own_files(
    rows_file, tmp_path, decodes, caplog
):
    """prepare() reads the file once and hands it to both splits: the second split decodes
    only its own new files, and each split's log line counts its own known files."""
    cache = tmp_path / "media_checks.json"
    _build(rows_file, cache)  # an earlier run
    checks = MediaChecks.load(cache)
    spec = DataSpec(source="jsonl", path=str(rows_file), eval_path=str(rows_file))
    decodes.clear()
    # The earlier run logs too where an earlier test left the rollplex loggers at INFO.
    caplog.clear()
    with caplog.at_level("INFO", logger="rollplex.data.rows"):
        for split in ("train", "test"):
            build_source(spec, split, 0, frames=2, checks=checks)
    assert decodes == []
    counts = [r.getMessage() for r in caplog.records if "unchanged since" in r.getMessage()]
    # 5 lookups a split (0.png once as an image, once as a video frame), not 5 then 10
    assert len(counts) == 2 and all(": 5 media files unchanged" in c for c in counts)
