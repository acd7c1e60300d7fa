"""Running a study's independent tasks in parallel processes."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from typing import Callable


def map_in_processes(task: Callable, tasks: list, progress: Callable[[int, int], None] | None = None,
                     workers: int | None = None) -> list:
    """``task(t)`` for every ``t`` in `tasks`, in processes (one per core unless
    `workers` says otherwise; in this process when one is enough), results in
    the order of `tasks`.  `progress(done, total)` after each.  Each task's
    runs are already vectorised, so parallelism pays across tasks, not within one."""
    workers = workers or min(len(tasks), os.cpu_count() or 1)
    parallel = workers > 1 and len(tasks) > 1
    results: list = []
    with ProcessPoolExecutor(max_workers=workers) if parallel else nullcontext() as pool:
        for r in (pool.map(task, tasks) if parallel else map(task, tasks)):
            results.append(r)
            if progress:
                progress(len(results), len(tasks))
    return results
