"""Spearman rank correlation with ties (distill.common.ranks), the recipe study's proxy check."""

from __future__ import annotations

import math

import pytest

from distill.common.ranks import spearman


def test_spearman_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert spearman([1, 1, 2], [1, 2, 3]) == pytest.approx(math.sqrt(3) / 2)  # ranks 0.5, 0.5, 2
    assert math.isnan(spearman([1, 1], [1, 2]))
