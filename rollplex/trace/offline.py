"""TensorBoard's profiler plugin without the internet (air-gapped clusters).

torch-tb-profiler 0.4.3's pages load two scripts from public CDNs: the Google Charts loader
(every chart of the Overview, Operator, Kernel and Memory views) and webcomponents 0.7.24
(the Trace view's viewer). Offline, every view spins forever. This module puts local
copies inline into the plugin's own pages, which the plugin then serves as before:

    npm pack webcomponents.js@0.7.24 && tar xzf webcomponents.js-0.7.24.tgz
    python -m rollplex.trace.offline --webcomponents package/webcomponents.min.js
    python -m rollplex.trace.offline --undo      # the plugin's pages as installed

- the charts loader is `offline/charts_loader.js`, a stand-in shipped here: it draws the
  plugin's charts as plain SVG lines and bars, pie charts as share lists and tables as
  HTML tables (no tooltips or zoom; Google Charts itself cannot be vendored);
- webcomponents.min.js is the npm package's file (BSD licence), which the Trace view's
  iframe needs in full (`-lite` leaves it blank).
The originals are kept beside the pages (`*.html.orig`); `--undo` restores them.
`bench/tensorboard_screenshots.py` serves the same two files by request interception.
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


def _inline(page: Path, tag: str, script: Path) -> bool:
    """Replace `tag` in `page` by `script` inline; False when the tag is not there."""
    text = page.read_text(encoding="utf-8")
    if tag not in text:
        return False
    backup = page.with_name(page.name + ".orig")
    if not backup.exists():
        shutil.copy2(page, backup)
    body = script.read_text(encoding="utf-8")
    page.write_text(text.replace(tag, f"<script>{body}</script>", 1), encoding="utf-8")
    return True


def install(webcomponents: Path, static: Path | None = None) -> list[Path]:
    """Put both scripts inline into the plugin's pages; the pages changed."""
    static = static or plugin_static()
    changed = []
    if _inline(static / "index.html", CHARTS_TAG, CHARTS_LOADER):
        changed.append(static / "index.html")
    if _inline(static / "trace_embedding.html", WEBCOMPONENTS_TAG, webcomponents):
        changed.append(static / "trace_embedding.html")
    return changed


def undo(static: Path | None = None) -> list[Path]:
    static = static or plugin_static()
    restored = []
    for backup in sorted(static.glob("*.html.orig")):
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
