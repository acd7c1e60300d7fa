"""Evaluating a row-wise function on some rows only.

The statistics functions take many runs (or chunks) at once, as arrays whose last axis is the
stratum axis, and treat every row alone: elementwise arithmetic and reductions over that last
axis only.  Where the caller keeps a result on some rows only (``np.where(mask, f(...), fill)``),
`on_rows` evaluates ``f`` on those rows alone: the same numbers on them (a row's arithmetic does
not depend on the rows beside it), none of the work on the others.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def on_rows(mask, fn: Callable[..., np.ndarray], per_stratum, per_row=(), fill=0) -> np.ndarray:
    """``np.where(mask[..., None], fn(*per_stratum, *per_row), fill)`` computing ``fn`` only on
    the rows where `mask` holds.

    `per_stratum` are arrays over (rows..., strata), `per_row` arrays over (rows...), either or
    None (passed as None), each broadcast to the rows; ``fn`` returns one value per stratum of each
    row it is given (the rows stacked on one leading axis) and must treat each row alone.  `fill`
    (broadcast to the result) stands where `mask` does not hold."""
    mask = np.asarray(mask, dtype=bool)
    rows = np.broadcast_shapes(mask.shape, *(np.shape(a)[:-1] for a in per_stratum if a is not None),
                               *(np.shape(a) for a in per_row if a is not None))
    k = max(np.shape(a)[-1] for a in per_stratum if a is not None)
    every = np.broadcast_to(mask, rows)
    if every.all():
        return np.asarray(np.where(mask[..., None], fn(*per_stratum, *per_row), fill))
    out = np.array(np.broadcast_to(fill, rows + (k,)))
    if not every.any():
        return out
    at = lambda a, shape: None if a is None else np.broadcast_to(a, shape)[every]  # noqa: E731
    sub = fn(*(at(a, rows + (k,)) for a in per_stratum), *(at(a, rows) for a in per_row))
    out = out.astype(np.result_type(out, sub), copy=False)
    out[every] = sub
    return out
