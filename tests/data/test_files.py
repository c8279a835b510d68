"""jsonl/parquet rows in the EasyR1/verl convention, and bad input named by file/row/field."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from PIL import Image

from rollplex.data import DataError, build_source
from rollplex.specs.data import DataSpec


def _png(path: Path, colour: int, mode: str = "RGB") -> Path:
    Image.new(mode, (8, 6), colour if mode == "L" else (colour, 0, 0)).save(path)
    return path


def _png_bytes(colour: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (5, 5), (0, colour, 0)).save(buf, format="PNG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "img").mkdir()
    for i in range(4):
        _png(tmp_path / "img" / f"{i}.png", 10 * i)
    _png(tmp_path / "img" / "grey.png", 77, mode="L")
    return tmp_path


def test_jsonl_with_images_relative_to_the_file(folder: Path) -> None:
    rows = [
        {"problem": "<image> what colour?", "answer": "red", "images": ["img/0.png"]},
        {
            "problem": "compare <image> and <image>",
            "answer": 2,
            "images": ["img/1.png", "img/grey.png"],
        },
        {"problem": "no picture", "answer": "x", "images": []},
    ]
    spec = DataSpec(source="jsonl", path=str(_jsonl(folder / "d.jsonl", rows)))
    src = build_source(spec, "train", 0)
    by_uid = {s.uid: s for s in src.batch(0, 3)}
    one, two, three = (by_uid[f"jsonl:train:{i}"] for i in range(3))
    assert one.problem == rows[0]["problem"] and one.answer == "red"
    assert one.images[0].getpixel((0, 0)) == (0, 0, 0)
    assert two.answer == "2" and [im.mode for im in two.images] == ["RGB", "RGB"]
    assert two.images[1].getpixel((0, 0)) == (77, 77, 77)  # grey "L" image, given as RGB
    assert three.images == () and three.video is None


def test_parquet_with_image_bytes_and_custom_keys(folder: Path) -> None:
    import datasets

    rows = {
        "question": ["a <image>", "b"],
        "gt": ["one", "two"],
        "pics": [[{"bytes": _png_bytes(200), "path": None}], [{"bytes": _png_bytes(100)}]],
    }
    path = folder / "d.parquet"
    datasets.Dataset.from_dict(rows).to_parquet(str(path))
    spec = DataSpec(
        source="parquet", path=str(path), prompt_key="question", answer_key="gt", image_key="pics"
    )
    samples = {s.uid: s for s in build_source(spec, "train", 1).batch(0, 2)}
    assert samples["parquet:train:0"].images[0].getpixel((1, 1)) == (0, 200, 0)
    assert samples["parquet:train:1"].images[0].getpixel((1, 1)) == (0, 100, 0)
    assert samples["parquet:train:1"].answer == "two"


def test_parquet_written_by_datasets_with_an_image_feature(folder: Path) -> None:
    import datasets

    features = datasets.Features(
        {
            "problem": datasets.Value("string"),
            "answer": datasets.Value("string"),
            "images": [datasets.Image()],
        }
    )
    rows = {"problem": ["<image>"], "answer": ["raw"], "images": [[_png_bytes(50)]]}
    path = folder / "f.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    (s,) = build_source(DataSpec(source="parquet", path=str(path)), "train", 0).batch(0, 1)
    assert s.images[0].mode == "RGB" and s.images[0].getpixel((0, 0)) == (0, 50, 0)


def test_video_as_frame_paths_is_sampled_uniformly(folder: Path) -> None:
    frames = [f"img/{i}.png" for i in range(4)]
    rows = [
        {"problem": "<video> which?", "answer": "a", "videos": [frames]},
        {"problem": "flat list", "answer": "b", "videos": frames},
    ]
    spec = DataSpec(source="jsonl", path=str(_jsonl(folder / "v.jsonl", rows)))
    src = build_source(spec, "train", 0, frames=2)
    for s in src.batch(0, 2):
        assert s.images == () and len(s.video) == 2
        assert [f.getpixel((0, 0))[0] for f in s.video] == [0, 30]  # frames 0 and 3
    seven = build_source(spec, "train", 0, frames=7).batch(0, 1)[0].video
    assert [f.getpixel((0, 0))[0] for f in seven] == [
        0,
        0,
        10,
        20,
        20,
        20,
        30,
    ]  # round half to even, as torch


def test_video_file_decoded_by_pil(folder: Path) -> None:
    gif = [Image.new("RGB", (8, 8), (40 * i, 0, 0)) for i in range(6)]
    gif[0].save(folder / "clip.gif", save_all=True, append_images=gif[1:], duration=40)
    rows = [{"problem": "<video>?", "answer": "a", "videos": "clip.gif"}]
    spec = DataSpec(source="jsonl", path=str(_jsonl(folder / "g.jsonl", rows)))
    (s,) = build_source(spec, "train", 0, frames=3).batch(0, 1)
    assert [f.mode for f in s.video] == ["RGB"] * 3
    assert [f.getpixel((0, 0))[0] for f in s.video] == pytest.approx(
        [0, 80, 200], abs=8
    )  # frames 0, 2, 5


def test_mp4_needs_pyav_or_decodes(folder: Path) -> None:
    (folder / "clip.mp4").write_bytes(b"not really a video")
    rows = [{"problem": "<video>?", "answer": "a", "videos": ["clip.mp4"]}]
    spec = DataSpec(source="jsonl", path=str(_jsonl(folder / "m.jsonl", rows)))
    # Every video is decoded once when the source is built: a file that does not decode
    # (or needs PyAV where it is missing) stops the run there, before any model loads.
    with pytest.raises(DataError, match=r"m\.jsonl row 0 field 'videos'.*clip\.mp4"):
        build_source(spec, "train", 0, frames=2)


def test_eval_path_is_the_test_split(folder: Path) -> None:
    train = _jsonl(folder / "t.jsonl", [{"problem": "p", "answer": "a"}] * 3)
    test = _jsonl(folder / "e.jsonl", [{"problem": "q", "answer": "b"}] * 2)
    spec = DataSpec(source="jsonl", path=str(train), eval_path=str(test), eval_max_rows=1)
    assert len(build_source(spec, "test", 0)) == 1
    assert build_source(spec, "test", 0).batch(0, 1)[0].problem == "q"
    with pytest.raises(DataError, match="eval_path"):
        build_source(DataSpec(source="jsonl", path=str(train)), "test", 0)


# Bad input: each names the file, the row and the field, when the source is built.


def test_row_whose_image_is_missing(folder: Path) -> None:
    rows = [
        {"problem": "ok", "answer": "a", "images": ["img/0.png"]},
        {"problem": "bad", "answer": "b", "images": ["img/nope.png"]},
    ]
    path = _jsonl(folder / "d.jsonl", rows)
    with pytest.raises(DataError, match=r"d\.jsonl row 1 field 'images'.*nope\.png does not exist"):
        build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)


def test_missing_answer_column(folder: Path) -> None:
    path = _jsonl(folder / "d.jsonl", [{"problem": "p", "solution": "a"}])
    with pytest.raises(DataError, match=r"d\.jsonl: no column 'answer' \(data\.answer_key\)"):
        build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)
    spec = DataSpec(source="jsonl", path=str(path), answer_key="solution")
    assert build_source(spec, "train", 0).batch(0, 1)[0].answer == "a"


def test_missing_answer_value(folder: Path) -> None:
    path = _jsonl(
        folder / "d.jsonl", [{"problem": "p", "answer": "a"}, {"problem": "q", "answer": None}]
    )
    with pytest.raises(DataError, match=r"d\.jsonl row 1 field 'answer': the answer is missing"):
        build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)


def test_unreadable_files(folder: Path) -> None:
    bad = folder / "bad.jsonl"
    bad.write_text('{"problem": "p", "answer": "a"}\n{"problem": oops}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: cannot read as jsonl \(line 2"):
        build_source(DataSpec(source="jsonl", path=str(bad)), "train", 0)
    junk = folder / "junk.parquet"
    junk.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DataError, match=r"junk\.parquet: cannot read as parquet"):
        build_source(DataSpec(source="parquet", path=str(junk)), "train", 0)
    with pytest.raises(DataError, match=r"absent\.jsonl does not exist"):
        build_source(DataSpec(source="jsonl", path=str(folder / "absent.jsonl")), "train", 0)


def test_corrupt_image_is_named_when_the_source_is_built(folder: Path) -> None:
    (folder / "img" / "broken.png").write_bytes(b"no png here")
    rows = [{"problem": "p", "answer": "a", "images": "img/0.png"}] * 17
    rows.append({"problem": "p", "answer": "a", "images": "img/broken.png"})
    spec = DataSpec(source="jsonl", path=str(_jsonl(folder / "d.jsonl", rows)))
    with pytest.raises(
        DataError, match=r"d\.jsonl row 17 field 'images': cannot decode image file"
    ):
        build_source(spec, "train", 0)
    import datasets  # bytes travel in parquet

    good = _png_bytes(9)
    images = [[{"bytes": good, "path": None}]] * 17 + [[{"bytes": good[:40], "path": None}]]
    path = folder / "b.parquet"
    datasets.Dataset.from_dict(
        {"problem": ["p"] * 18, "answer": ["a"] * 18, "images": images}
    ).to_parquet(str(path))
    with pytest.raises(DataError, match=r"b\.parquet row 17 field 'images': cannot decode image"):
        build_source(DataSpec(source="parquet", path=str(path)), "train", 0)


@pytest.mark.parametrize("answer", [{"a": 1}, ["yes"], True])
def test_an_answer_that_is_not_a_string_or_number_is_refused(folder: Path, answer) -> None:
    rows = [{"problem": "p", "answer": "a"}, {"problem": "q", "answer": answer}]
    path = _jsonl(folder / "d.jsonl", rows)
    with pytest.raises(
        DataError, match=r"d\.jsonl row 1 field 'answer': an answer is text or a number"
    ):
        build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)


def test_an_edit_that_keeps_size_and_mtime_is_read_afresh(folder: Path) -> None:
    import os

    path = _jsonl(folder / "d.jsonl", [{"problem": "p", "answer": "old"}])
    spec = DataSpec(source="jsonl", path=str(path))
    assert build_source(spec, "train", 0).batch(0, 1)[0].answer == "old"
    stat = path.stat()
    _jsonl(path, [{"problem": "p", "answer": "new"}])  # same length
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert build_source(spec, "train", 0).batch(0, 1)[0].answer == "new"


def test_videos_sampled_to_other_frame_counts_are_said(folder: Path, caplog) -> None:
    frames = [f"img/{i}.png" for i in range(4)]
    rows = [{"problem": "<video>", "answer": "a", "videos": [frames]}] * 2
    rows.append({"problem": "<video>", "answer": "a", "videos": [frames[:2]]})
    spec = DataSpec(source="jsonl", path=str(_jsonl(folder / "v.jsonl", rows)))
    with caplog.at_level("WARNING", logger="rollplex.data.rows"):
        build_source(spec, "train", 0, frames=4)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "1 of 3 videos have other than workload.frames=4" in said
    assert "row 2 with 2" in said and "repeating frames" in said
    caplog.clear()
    with caplog.at_level("WARNING", logger="rollplex.data.rows"):
        build_source(spec, "train", 0, frames=2)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "2 of 3 videos" in said and "(4 to 4; first: row 0 with 4)" in said
    assert "repeating" not in said


def test_placeholders_must_match_the_media(folder: Path) -> None:
    rows = [{"problem": "<image> <image>", "answer": "a", "images": ["img/0.png"]}]
    path = _jsonl(folder / "d.jsonl", rows)
    with pytest.raises(DataError, match=r"row 0 field 'problem': 2 <image> placeholder\(s\) but 1"):
        build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)
    path = _jsonl(folder / "v.jsonl", [{"problem": "<video>", "answer": "a"}])
    with pytest.raises(DataError, match=r"row 0 field 'problem': <video> placeholder but"):
        build_source(DataSpec(source="jsonl", path=str(path)), "train", 0)


def test_unknown_source() -> None:
    with pytest.raises(ValueError, match="source"):
        DataSpec(source="webdataset")
    with pytest.raises(DataError, match="unknown data source 'webdataset'"):
        build_source(DataSpec.model_construct(source="webdataset"), "train", 0)
