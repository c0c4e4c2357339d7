"""The paired-ratio table the side-by-side benchmarks print.

On a shared machine the speed of the same loop drifts by +-25% within seconds, so variants
are timed round by round and judged by the median over rounds of baseline time / variant
time in the same round, not by separate medians.
"""

from __future__ import annotations

import statistics


def print_paired_table(
    seconds: dict[str, list[float]], labels: dict[str, str], *, baseline: str, work: int, unit: str
) -> dict[str, float]:
    """Print each variant's median and best time, throughput and paired ratio to ``baseline``.

    Args:
        seconds: ``{variant: [seconds per round]}``, rounds aligned across variants.
        labels: ``{variant: label}`` printed in the first column.
        baseline: The variant the others are divided into (its own ratio is 1).
        work: Units of work per round (samples, env steps), for the throughput column.
        unit: Name of the throughput column, e.g. ``"samples/s"``.

    Returns:
        ``{variant: paired ratio}``; above 1 means faster than the baseline.
    """
    width = max(len(label) for label in labels.values()) + 4
    print(f"{'variant':<{width}}{'median s':>10}{'best s':>9}{unit:>13}{'paired vs (a)':>22}")
    paired: dict[str, float] = {}
    for name, values in seconds.items():
        ratios = [a / x for a, x in zip(seconds[baseline], values)]
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else [ratios[0]] * 9
        paired[name] = statistics.median(ratios)
        median = statistics.median(values)
        print(
            f"{labels[name]:<{width}}{median:>10.4f}{min(values):>9.4f}{work / median:>13,.0f}"
            f"{paired[name]:>9.2f}x [{deciles[0]:.2f}-{deciles[-1]:.2f}]"
        )
    return paired
