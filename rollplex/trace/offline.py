"""TensorBoard's profiler plugin without the internet (air-gapped clusters).

Inlines local copies of the scripts torch-tb-profiler loads from CDNs into its pages (an SVG
charts stand-in shipped in offline/, the npm webcomponents.min.js); `--undo` restores them.
    npm pack webcomponents.js@0.7.24 && tar xzf webcomponents.js-0.7.24.tgz
    python -m rollplex.trace.offline --webcomponents package/webcomponents.min.js
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

CHARTS_LOADER = Path(__file__).resolve().parent / "offline" / "charts_loader.js"
CHARTS_TAG = '<script src="https://www.gstatic.com/charts/loader.js"></script>'
WEBCOMPONENTS_TAG = (
    '<script src="https://cdnjs.cloudflare.com/ajax/libs/webcomponentsjs/0.7.24/'
    'webcomponents.min.js"></script>'
)
WEBCOMPONENTS_ENV = "ROLLPLEX_WEBCOMPONENTS"
# trace_embedding.html titles every trace "unknown" (index.js posts no name): read the
# trace's own `traceName` from the head of the text it posts (no second JSON parse)
TITLE_OLD = "name = data.name || 'unknown'"
TITLE_NEW = (
    "name = data.name || (typeof data.data === 'string' && "
    '(data.data.slice(0, 4096).match(/"traceName":\\s*"([^"]*)"/) || [])[1]) || \'unknown\''
)
TC_LIST_END = "'xmma_gemm', 'xmma_sparse_gemm', 'c1688']"  # tensor_core.py's allowlist
TC_PATTERNS = ("nvjet",)  # cuBLAS's Hopper/Blackwell GEMM kernels (bf16 GEMMs on an H200)


def find_webcomponents(path: Path | None = None) -> Path:
    """webcomponents.min.js 0.7.24: `path`, else $ROLLPLEX_WEBCOMPONENTS; a clear error
    saying how to get it otherwise."""
    candidate = path or (
        Path(os.environ[WEBCOMPONENTS_ENV]) if WEBCOMPONENTS_ENV in os.environ else None
    )
    if candidate is None or not candidate.is_file():
        raise FileNotFoundError(
            f"webcomponents.min.js: {candidate or 'not given'}; get it with `npm pack "
            "webcomponents.js@0.7.24 && tar xzf webcomponents.js-0.7.24.tgz` (the file is "
            f"package/webcomponents.min.js) and pass --webcomponents or set {WEBCOMPONENTS_ENV}"
        )
    if "</script" in candidate.read_text(errors="replace"):
        raise ValueError(f"{candidate}: holds '</script', cannot be put inline")
    return candidate


def plugin_static() -> Path:
    import torch_tb_profiler

    return Path(torch_tb_profiler.__file__).resolve().parent / "static"


def _replace(path: Path, old: str, new: str) -> bool:
    """`old` replaced by `new` in `path` (the original kept as `*.orig`); False when `old`
    is not there (done already, or another plugin version)."""
    text = path.read_text(encoding="utf-8")
    if old not in text:
        return False
    backup = path.with_name(path.name + ".orig")
    if not backup.exists():
        shutil.copy2(path, backup)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return True


def _inline(page: Path, tag: str, script: Path) -> bool:
    body = script.read_text(encoding="utf-8")
    return _replace(page, tag, f"<script>{body}</script>")


def teach_tensor_cores(profiler: Path) -> bool:
    """Add `TC_PATTERNS` to the plugin's tensor-core kernel list (`profiler/tensor_core.py`)."""
    extra = "".join(f", '{p}'" for p in TC_PATTERNS)
    return _replace(profiler / "tensor_core.py", TC_LIST_END, TC_LIST_END[:-1] + extra + "]")


def install(webcomponents: Path, static: Path | None = None) -> list[Path]:
    """Put both scripts inline into the plugin's pages and teach it `nvjet` kernels; the
    files changed. `static`: the plugin's static folder (its profiler/ beside it)."""
    static = static or plugin_static()
    changed = []
    if _inline(static / "index.html", CHARTS_TAG, CHARTS_LOADER):
        changed.append(static / "index.html")
    if _inline(static / "trace_embedding.html", WEBCOMPONENTS_TAG, webcomponents):
        changed.append(static / "trace_embedding.html")
    if _replace(static / "trace_embedding.html", TITLE_OLD, TITLE_NEW):
        changed.append(static / "trace_embedding.html")
    if teach_tensor_cores(static.parent / "profiler"):
        changed.append(static.parent / "profiler" / "tensor_core.py")
    return list(dict.fromkeys(changed))


def undo(static: Path | None = None) -> list[Path]:
    static = static or plugin_static()
    restored = []
    for backup in sorted([*static.glob("*.orig"), *(static.parent / "profiler").glob("*.orig")]):
        page = backup.with_name(backup.name.removesuffix(".orig"))
        os.replace(backup, page)
        restored.append(page)
    return restored


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="torch-tb-profiler's pages without the internet")
    ap.add_argument("--webcomponents", type=Path, help="webcomponents.min.js 0.7.24")
    ap.add_argument("--undo", action="store_true", help="restore the plugin's pages")
    args = ap.parse_args(argv)
    done = undo() if args.undo else install(find_webcomponents(args.webcomponents))
    print("\n".join(str(p) for p in done) or "nothing to change (already done?)")


if __name__ == "__main__":
    main()
