"""reward.overlong_buffer (DAPO's soft overlong punishment, verl's overlong_buffer): no
penalty up to the buffer's start, a linear ramp to -overlong_penalty at the cap, added to
each response's total and logged as reward/overlong."""

from __future__ import annotations

import itertools

import pytest

from rollplex.data.rewards import build_reward
from rollplex.data.rewards.overlong import OverlongPenalty
from rollplex.data.sample import Sample
from rollplex.runtime.scoring import ResponseScorer
from rollplex.specs import RewardSpec


@pytest.mark.parametrize("cap", [8, 64, 512])
@pytest.mark.parametrize("buffer", [1, 4, 7])
@pytest.mark.parametrize("penalty", [0.5, 1.0, 2.0])
def test_free_up_to_the_buffer_then_a_ramp_to_the_penalty_at_the_cap(cap, buffer, penalty):
    fn = OverlongPenalty(cap, buffer, penalty)
    out = fn(range(cap + 1))  # out[n]: a response of n tokens
    assert all(p == 0.0 for p in out[: cap - buffer + 1])
    assert out[cap] == pytest.approx(-penalty)
    assert all(b <= a for a, b in itertools.pairwise(out))  # never less punishment for longer
    inside = out[cap - buffer + 1 :]
    assert all(-penalty <= p < 0 for p in inside)
    if buffer % 2 == 0:  # half-way into the buffer: half the penalty
        assert out[cap - buffer // 2] == pytest.approx(-penalty / 2)


class _Chars:
    """A tokenizer whose tokens are characters: token id = ord(char)."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(map(chr, r)) for r in rows]


def test_the_scorer_adds_it_to_each_total_and_logs_its_mean():
    reward = build_reward(RewardSpec())  # exact_match
    sample = Sample(uid="t:train:0", problem="q", answer="yes")
    yes = [ord(c) for c in "yes     "]  # the answer, then spaces to the cap
    tokens, lengths = [yes, yes], [3, 8]  # the second ran to the cap (8), unfinished
    plain = ResponseScorer(_Chars(), reward)(tokens, lengths, [sample], 2)
    shaped = ResponseScorer(_Chars(), reward, OverlongPenalty(8, 4, 1.0))
    got = shaped(tokens, lengths, [sample], 2)
    assert plain.rewards == [1.0, 1.0] and "reward/overlong" not in plain.metrics
    assert got.rewards == [1.0, 0.0]  # 3 tokens: free; 8 (the cap): loses the penalty
    assert got.metrics["reward/overlong"] == -0.5
    assert got.metrics["reward/exact_match"] == plain.metrics["reward/exact_match"]
