"""bench case: the live view's loss chart redrawn after 50,000 logged steps against after 500."""

from __future__ import annotations

import math
import statistics
import time

from bench.common import Result


def median_of(fn, repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def run(args) -> list[Result]:
    """The live view's loss chart redrawn after 50,000 logged steps, against after 500."""
    from gptcli.cli.render.training import Series, loss_chart

    def redraw(steps: int) -> float:
        points = [(s, 3.0 * math.exp(-s / steps) + 1.0) for s in range(1, steps + 1)]
        train, val = Series(points), Series(points[:: steps // 100])  # 100 evaluations either way
        t0 = time.perf_counter()
        loss_chart(train, val, 110, 16)
        return time.perf_counter() - t0

    redraw(500)
    short, long = median_of(lambda: redraw(500), 5), median_of(lambda: redraw(50_000), 5)
    return [
        Result(
            "live loss chart redraw, 50,000 steps of history (vs 500)",
            long * 1000,
            short * 1000,
            "ms",
            "the same chart after 500 steps",
            "<= 2x",
            long <= 2 * short,
        )
    ]
