"""Screenshots of a train run's TensorBoard, taken offline in headless Chromium.

    python bench/tensorboard_screenshots.py [--run <run folder> --prefix <name>]
        [--out bench/results/tensorboard]

Without `--run` it first trains the CPU demo for a few steps (`rollplex train
train.steps=6 ...`, ~10 s). It then serves the run with TensorBoard on loopback and opens,
in headless Chromium (`apt-get install chromium`, driven by the `playwright` package; no
browser download), the profiler plugin's Overview (worker measured0), Trace and Memory
views and TensorBoard's Images tab with the planned-vs-measured panel, saving one PNG each.

Offline: the plugin's pages fetch two scripts from public CDNs, the Google Charts loader
and webcomponents 0.7.24. The browser gets the plugin's two pages as `python -m
rollplex.trace.offline` leaves them (patched in a temporary copy: the charts-loader stand-in
rollplex/trace/offline/charts_loader.js and webcomponents.min.js from `npm pack
webcomponents.js@0.7.24`, `--webcomponents`, put inline; the Trace view titled by the
trace), and every request off loopback is refused and counted, so the pictures show what
an air-gapped user sees.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rollplex.trace.offline import find_webcomponents, install, plugin_static  # noqa: E402
from tests.tensorboard_server import tensorboard  # noqa: E402

VIEWS = ("Overview", "Trace", "Memory")
PAGES = ("index.html", "trace_embedding.html")
WAIT_FOR = {"Overview": "GPU Summary", "Memory": "Peak Memory Usage"}


def train_demo(run: Path) -> None:
    cmd = [
        sys.executable, "-m", "rollplex.cli", "train", "train.steps=6", "train.eval_every=0",
        "train.checkpoint_every=0", "train.progress=false", f"hydra.run.dir={run}",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def offline_pages(webcomponents: Path, folder: Path) -> Path:
    """The plugin's pages as `python -m rollplex.trace.offline` leaves them, made in
    `folder` (the installed plugin stays untouched); their static folder."""
    static, profiler = folder / "static", folder / "profiler"
    shutil.copytree(plugin_static(), static)
    profiler.mkdir()
    shutil.copy2(plugin_static().parent / "profiler" / "tensor_core.py", profiler)
    install(webcomponents, static)
    return static


def _offline(page, base: str, static: Path, refused: list[str]) -> None:
    """Loopback only; the plugin's two pages come from `static` (patched)."""

    def route(r) -> None:
        url = r.request.url
        name = url.split("?")[0].rsplit("/", 1)[-1]
        if url.startswith(base) and "/pytorch_profiler/" in url and name in PAGES:
            r.fulfill(path=str(static / name), content_type="text/html")
        elif url.startswith(base):
            r.continue_()
        else:  # the CDN scripts are inline now: nothing may leave the machine
            refused.append(url)
            r.abort()

    page.route("**/*", route)


def _choose(page, label: str, option: str) -> None:
    """Pick `option` in the plugin's left-hand select under `label` (Material UI)."""
    page.locator(f"text={label}").first.locator("xpath=following::div[@role='button'][1]").click()
    page.locator(f"li[role='option']:has-text('{option}')").first.click()


def screenshots(run: Path, out: Path, webcomponents: Path, prefix: str = "cpu") -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shots, refused = [], []
    with (
        tempfile.TemporaryDirectory() as tmp,
        tensorboard(run, "tb", Path(tmp) / "tb.log") as srv,
        sync_playwright() as pw,
    ):
        static = offline_pages(webcomponents, Path(tmp) / "plugin")
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        _offline(page, srv.url, static, refused)
        page.goto(f"{srv.url}/data/plugin/pytorch_profiler/index.html")
        page.wait_for_selector("text=GPU Summary", timeout=120_000)
        _choose(page, "Workers", "measured0")
        for view in VIEWS:
            _choose(page, "Views", view)
            if view in WAIT_FOR:
                page.wait_for_selector(f"text={WAIT_FOR[view]}", timeout=120_000)
            if view == "Trace":  # the viewer's iframe loads the trace, then draws
                page.wait_for_selector("iframe", timeout=120_000)
                frame = page.frame_locator("iframe").first
                frame.locator("tr-ui-timeline-view, #trace-viewer").first.wait_for(timeout=120_000)
                time.sleep(20)
            time.sleep(3)
            path = out / f"{prefix}_{view.lower()}_measured0.png"
            page.screenshot(path=str(path), full_page=True)
            shots.append(path)
        page.goto(f"{srv.url}/#images")
        page.wait_for_selector("text=planned_vs_measured", timeout=120_000)
        page.locator("text=Show actual image size").click()  # the panel at full size
        time.sleep(3)
        path = out / f"{prefix}_planned_vs_measured.png"
        page.screenshot(path=str(path), full_page=True)
        shots.append(path)
        browser.close()
    print(f"requests off loopback (refused): {len(refused)} {refused[:3]}")
    return shots


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, help="a train run folder (default: train the demo)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tensorboard")
    ap.add_argument("--webcomponents", type=Path, help="webcomponents.min.js 0.7.24")
    ap.add_argument("--prefix", default="cpu", help="the screenshots' names start with it")
    args = ap.parse_args()
    webcomponents = find_webcomponents(args.webcomponents)
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            run = Path(tmp) / "demo"
            train_demo(run)
        for path in screenshots(run, args.out, webcomponents, args.prefix):
            print(path)


if __name__ == "__main__":
    main()
