"""Statistics for sampling tests."""

from __future__ import annotations

from collections import Counter

import torch


def chi_square_p_value(observed: Counter, expected: dict, n: int) -> float:
    """Pearson χ² goodness of fit; p-value from the regularized upper gamma function."""
    stat = sum((observed.get(k, 0) - n * e) ** 2 / (n * e) for k, e in expected.items() if e > 0)
    dof = sum(1 for e in expected.values() if e > 0) - 1
    assert sum(observed[k] for k in observed if expected.get(k, 0) == 0) == 0, "impossible outcome seen"
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
