"""data.max_prompt_tokens (verl's max_prompt_length with filter_overlong_prompts): the rows
whose rendered prompt, visual and text tokens together, fits; the plan is then sized for
the longest kept prompt, so a few outliers no longer size every step."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from rollplex.data.order import IndexedSource
from rollplex.data.render import PromptRenderer
from rollplex.data.sample import DataError, RowMedia, Sample
from rollplex.data.steps import prompt_lengths

log = logging.getLogger(__name__)


class KeptRows(IndexedSource):
    """`inner`'s rows at `kept` (file order), in epochs of their own; a row keeps its uid."""

    def __init__(self, inner: IndexedSource, kept: list[int]) -> None:
        super().__init__(inner.name, inner.split, inner.seed, len(kept))
        self.inner, self.kept = inner, kept
        self.frames = getattr(inner, "frames", 1)

    def row(self, index: int) -> Sample:
        return self.inner.row(self.kept[index])

    def uid(self, index: int) -> str:
        return self.inner.uid(self.kept[index])

    def prompt_rows(self) -> Iterator[tuple[str, str, RowMedia]]:
        wanted = set(self.kept)
        for i, row in enumerate(self.inner.prompt_rows()):
            if i in wanted:
                yield row


def keep_prompts_within(
    source: IndexedSource, renderer: PromptRenderer, max_tokens: int
) -> IndexedSource:
    """`source` less the rows whose prompt exceeds `max_tokens`, saying how many left; a
    DataError naming data.max_prompt_tokens where none is left. Sources that list no row
    sizes (generated ones, whose rows share one shape) are checked by the run's sizing."""
    rows = getattr(source, "prompt_rows", None)
    if rows is None:
        return source
    frames = getattr(source, "frames", 1)
    kept, lengths = [], []
    for i, (_, _, visual, text) in enumerate(prompt_lengths(renderer, rows(), frames)):
        lengths.append(visual + text)
        if visual + text <= max_tokens:
            kept.append(i)
    longest = max(lengths)
    where = f"data '{source.name}' split '{source.split}'"
    if not kept:
        raise DataError(
            f"data.max_prompt_tokens={max_tokens}: every prompt of {where} is longer (the "
            f"shortest has {min(lengths)} tokens, visual and text)"
        )
    if len(kept) == len(source):
        return source
    log.info(
        "%s: %d of %d rows dropped, their prompts over data.max_prompt_tokens=%d (longest %d)",
        where, len(source) - len(kept), len(source), max_tokens, longest,
    )  # fmt: skip
    return KeptRows(source, kept)
