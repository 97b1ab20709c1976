"""The bootstrap behind every interval: checked on examples small enough to work out by hand."""

from __future__ import annotations

import pytest

from distill.eval.figures import quality_difference
from distill.eval.intervals import bootstrap, difference, ratio, ratio_of_ratios


def test_two_prompts_give_the_interval_worked_out_by_hand():
    """Prompts accepting 1 of 2 and 3 of 4 draft tokens: pooled 4/6. A resample holds the first twice
    (1/2, probability 1/4), the second twice (3/4, 1/4) or one of each (4/6, 1/2), so the 2.5% and
    97.5% percentiles are 1/2 and 3/4."""
    iv = bootstrap({"accepted": [1, 3], "proposed": [2, 4]}, ratio("accepted", "proposed"), resamples=20000)
    assert iv.value == pytest.approx(4 / 6)
    assert (iv.low, iv.high) == (pytest.approx(0.5), pytest.approx(0.75))
    assert iv.prompts == 2 and iv.level == 0.95


def test_identical_prompts_have_no_spread_and_the_same_seed_gives_the_same_interval():
    iv = bootstrap({"a": [3, 3, 3], "b": [4, 4, 4]}, ratio("a", "b"))
    assert iv.low == iv.value == iv.high == pytest.approx(0.75)
    columns = {"a": [1, 5, 2, 8, 3], "b": [4, 6, 5, 9, 4]}
    assert bootstrap(columns, ratio("a", "b"), seed=3) == bootstrap(columns, ratio("a", "b"), seed=3)


def test_a_paired_difference_sees_a_gain_that_the_prompts_spread_would_hide():
    """Draft B accepts one token more than draft A on every prompt, while prompts differ widely: the
    paired difference excludes 0 and is narrower than either draft's own interval."""
    a_acc, proposed = [2, 10, 30, 5, 18, 40, 7, 25], [40] * 8
    columns = {"a": a_acc, "b": [x + 1 for x in a_acc], "p": proposed}
    a, b = ratio("a", "p"), ratio("b", "p")
    gain = bootstrap(columns, difference(b, a))
    alone = bootstrap(columns, a)
    assert gain.value == pytest.approx(1 / 40)
    assert gain.excludes(0.0) and gain.low == pytest.approx(1 / 40) and gain.high == pytest.approx(1 / 40)
    assert alone.high - alone.low > 0.1 and not bootstrap(columns, difference(a, a)).excludes(0.0)


def test_the_decode_speedup_is_a_ratio_of_pooled_times_per_token():
    """Target 2 s for 10 tokens and 6 s for 20, speculative 1 s and 2 s: TPOT 8/30 over 3/30 = 8/3."""
    columns = {"t_s": [2, 6], "t_n": [10, 20], "s_s": [1, 2], "s_n": [10, 20]}
    assert bootstrap(columns, ratio_of_ratios("t_s", "t_n", "s_s", "s_n")).value == pytest.approx(8 / 3)
    with pytest.raises(ValueError, match="no prompts"):
        bootstrap({"x": []}, ratio("x", "x"))


def test_an_interval_prints_as_value_and_bounds():
    iv = bootstrap({"a": [1, 3], "b": [2, 4]}, ratio("a", "b"), resamples=20000)
    assert f"{iv:.2f}" == "0.67 [0.50, 0.75]"


def test_a_quality_difference_is_paired_over_prompts_worked_out_by_hand():
    """Four prompts, the speculative answer wrong where target-only's was right on one: −1/4. A resample
    holds that prompt j times, j ~ Binomial(4, 1/4): none with probability 0.32 (difference 0), three or
    four with 0.051 (−3/4 or −1), four with 0.004, so the 2.5% and 97.5% percentiles are −3/4 and 0."""
    diff = quality_difference([1, 0, 1, 1], [1, 0, 1, 0])
    assert diff["value"] == pytest.approx(-0.25) and not diff["outside_noise"]
    assert (diff["low"], diff["high"]) == (pytest.approx(-0.75), pytest.approx(0.0))
    same = quality_difference([1, 0, 1, 1], [1, 0, 1, 1])
    assert same["value"] == same["low"] == same["high"] == 0.0 and not same["outside_noise"]
    assert quality_difference([0] * 6, [1] * 6)["outside_noise"]
