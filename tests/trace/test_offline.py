"""The profiler plugin's pages made to work offline: both CDN scripts put inline into a copy
of the plugin's static folder, and undone byte for byte."""

from __future__ import annotations

import shutil

import pytest

from rollplex.trace import offline

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")


def _snapshot(*roots):
    return {p.as_posix(): p.read_bytes() for r in roots for p in r.rglob("*") if p.is_file()}


def test_both_cdn_scripts_go_inline_and_come_back(tmp_path):
    static = tmp_path / "static"
    shutil.copytree(offline.plugin_static(), static)
    profiler = tmp_path / "profiler"
    profiler.mkdir()
    shutil.copy2(offline.plugin_static().parent / "profiler" / "tensor_core.py", profiler)
    before = _snapshot(static, profiler)
    fake = tmp_path / "webcomponents.min.js"
    fake.write_text("window.WebComponents = {flags: {}};")
    changed = offline.install(offline.find_webcomponents(fake), static)
    assert sorted(p.name for p in changed) == [
        "index.html",
        "tensor_core.py",
        "trace_embedding.html",
    ]
    index = (static / "index.html").read_text()
    embedding = (static / "trace_embedding.html").read_text()
    assert offline.CHARTS_TAG not in index and "google.visualization = viz" in index
    assert offline.WEBCOMPONENTS_TAG not in embedding and fake.read_text() in embedding
    assert offline.TITLE_OLD not in embedding and offline.TITLE_NEW in embedding
    assert offline.install(fake, static) == []  # done already: nothing changes twice
    # Hopper's cuBLAS GEMMs (an H200 profile's names) now count as tensor-core time
    code = (profiler / "tensor_core.py").read_text()
    scope: dict = {}
    exec(compile(code, "tensor_core.py", "exec"), scope)
    assert "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_" in scope["TC_Allowlist"]
    assert "triton_poi_fused_add_0" not in scope["TC_Allowlist"]
    offline.undo(static)
    assert _snapshot(static, profiler) == before


def test_a_missing_webcomponents_file_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv(offline.WEBCOMPONENTS_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=r"npm pack webcomponents\.js@0\.7\.24"):
        offline.find_webcomponents(tmp_path / "nope.js")
