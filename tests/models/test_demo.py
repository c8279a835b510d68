"""The embedded demo folder: built once per recipe in the cache, atomically, from the
dataset's text, and a real Hub folder (Qwen2.5-VL's special tokens and chat template)."""

from __future__ import annotations

import pytest

from rollplex.data import motion, shapes
from rollplex.models import demo, ensure_demo_folder, open_model_folder
from rollplex.models.demo import SPECIAL_TOKENS


def test_builds_once_and_is_reused(built, monkeypatch):
    root, folder, seconds = built
    assert seconds < 60  # ~15 s on a shared 2-core machine
    assert folder.parent == root and demo.recipe_hash() in folder.name
    assert [p.name for p in root.iterdir()] == [folder.name]  # no temporaries left
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    def no_build(_):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(demo, "build_demo_folder", no_build)
    monkeypatch.setenv("ROLLPLEX_HOME", str(root))
    assert ensure_demo_folder() == folder  # ROLLPLEX_HOME is the default root
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps


def test_a_changed_recipe_builds_a_new_folder(built, monkeypatch):
    root, folder, _ = built
    monkeypatch.setattr(demo, "recipe_hash", lambda: "changed")
    monkeypatch.setattr(
        demo, "build_demo_folder", lambda p: (p.mkdir(), (p / "config.json").touch())
    )
    new = ensure_demo_folder(root)
    assert new != folder and new.name.endswith("changed") and folder.is_dir()


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    def broken(p):
        p.mkdir()
        (p / "config.json").write_text("{")
        raise RuntimeError("killed")

    monkeypatch.setattr(demo, "build_demo_folder", broken)
    with pytest.raises(RuntimeError):
        ensure_demo_folder(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_is_a_hub_folder_with_qwen_tokens(built):
    _, folder, _ = built
    opened = open_model_folder(folder)
    tok = opened.tokenizer()
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(7))
    assert 300 <= len(tok) <= 700 and opened.spec.vocab_size == len(tok)
    assert opened.spec.head_dim == 32 and 2 * sum(opened.spec.mrope_section) == 32
    import easy_vqa

    for word in [*easy_vqa.get_answers(), *shapes.ANSWER_WORDS, *motion.ANSWER_WORDS]:
        assert len(tok.encode(word, add_special_tokens=False)) == 1, word
    chat = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what shape?"}]}
    ]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
    assert ids[0] == 1 and ids.count(5) == 1  # <|im_start|> first, one <|image_pad|>
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    assert (folder / "chat_template.jinja").is_file()  # what vLLM reads for chat prompts
    model = opened.load_model()
    assert model.config.text_config.vocab_size == len(tok)
