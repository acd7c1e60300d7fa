"""Running a study's independent tasks in parallel processes."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from typing import Callable, Iterator


def iter_in_processes(task: Callable, tasks: list, workers: int | None = None) -> Iterator:
    """``task(t)`` for every ``t`` in `tasks`, in processes (one per core unless `workers` says
    otherwise; in this process when one is enough), yielded in the order of `tasks` as they finish.
    Each task's runs are already vectorised, so parallelism pays across tasks, not within one."""
    workers = workers or min(len(tasks), os.cpu_count() or 1)
    parallel = workers > 1 and len(tasks) > 1
    with ProcessPoolExecutor(max_workers=workers) if parallel else nullcontext() as pool:
        yield from (pool.map(task, tasks) if parallel else map(task, tasks))


def map_in_processes(task: Callable, tasks: list, progress: Callable[[int, int], None] | None = None,
                     workers: int | None = None) -> list:
    """`iter_in_processes` as a list, `progress(done, total)` after each task."""
    results: list = []
    for r in iter_in_processes(task, tasks, workers):
        results.append(r)
        if progress:
            progress(len(results), len(tasks))
    return results
