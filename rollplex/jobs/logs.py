"""The run log's one setup, shared by every job: quiet by default, `--verbose` for detail.

`setup_logging()` runs once inside the Hydra task (Hydra owns the handlers): console lines
go through `tqdm.write`, each warning shows once per run (repeats counted and reported at
the end), and transformers' inner progress bars are off. `--verbose`
(`ROLLPLEX_VERBOSE=1`) filters nothing and logs `rollplex` at DEBUG.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import Counter

VERBOSE_ENV = "ROLLPLEX_VERBOSE"
# Third-party loggers that repeat one warning per call: shown once unless verbose.
CHATTY = ("vllm.v1.worker.cpu_worker",)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def take_verbose_flag(argv: list[str]) -> list[str]:
    """`argv` without `--verbose`/`-v` (the CLI's one option); sets the environment so that
    every process of the run (torchrun ranks included) sees it."""
    rest = [a for a in argv if a not in ("--verbose", "-v")]
    if len(rest) != len(argv):
        os.environ[VERBOSE_ENV] = "1"
    return rest


class _TqdmStream:
    """A console stream that writes through tqdm, above any bar being drawn."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        from tqdm import tqdm

        if text.strip():
            tqdm.write(text.rstrip("\n"), file=self.stream)

    def flush(self) -> None:
        self.stream.flush()


class OncePerRun(logging.Filter):
    """Passes a record of WARNING and above the first time its (logger, message) is seen;
    counts the repeats it drops. Lower levels pass."""

    def __init__(self) -> None:
        super().__init__()
        self.repeats: Counter[tuple[str, str]] = Counter()
        self._seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        if key in self._seen:
            self.repeats[key] += 1
            return False
        self._seen.add(key)
        return True


_ONCE = OncePerRun()


def setup_logging(is_verbose: bool | None = None) -> None:
    """Idempotent; see the module docstring."""
    is_verbose = verbose() if is_verbose is None else is_verbose
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.stdout,
            sys.stderr,
        ):
            handler.setStream(_TqdmStream(handler.stream))
        if not is_verbose and _ONCE not in handler.filters:
            handler.addFilter(_ONCE)
    for name in CHATTY:
        chatty = logging.getLogger(name)
        if not is_verbose and _ONCE not in chatty.filters:
            chatty.addFilter(_ONCE)
    if is_verbose:
        logging.getLogger("rollplex").setLevel(logging.DEBUG)
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return
    if is_verbose:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()


def report_repeats(log: logging.Logger) -> None:
    """One line naming the warnings shown once and how often each repeated."""
    if not _ONCE.repeats:
        return
    parts = [f"{n}x '{msg[:60]}' ({name})" for (name, msg), n in _ONCE.repeats.most_common(3)]
    log.info("repeated warnings not shown (--verbose shows them): %s", "; ".join(parts))
    _ONCE.repeats.clear()
