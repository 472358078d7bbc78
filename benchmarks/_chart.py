"""An SVG chart of a run's turn tables: chatkeep's p50 per turn as a multiple of the fastest raw path's.

Plain SVG, written by hand, so the docs' chart needs no plotting library: ``python -m benchmarks --chart FILE``.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from benchmarks._common import Result

__all__ = ["write_chart"]

_ROW, _LEFT, _WIDTH, _SCALE_MAX = 22, 190, 720, 3.0


def write_chart(path: str, recorded: list[tuple[str, str, Result, float]]) -> int:
    """Draw one bar per chatkeep row of every "turn" table; returns how many bars were drawn.

    ``recorded`` holds ``(suite, table title, result, ratio)``; a suite covering several databases (sql) names
    the database before the colon of its titles.
    """
    rows = [
        (title.split(":")[0] if suite == "sql" else suite, result.size, value)
        for suite, title, result, value in recorded
        if "turn" in title.lower() and result.name.startswith("chatkeep")
    ]
    plot = _WIDTH - _LEFT - 60
    height = 60 + _ROW * len(rows)

    def x(value: float) -> float:
        return _LEFT + plot * min(value, _SCALE_MAX) / _SCALE_MAX

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        '<text x="10" y="20" font-size="14">chatkeep turn (load last 20 + append 2), p50 as a multiple of the '
        "fastest raw driver path, same run</text>",
    ]
    for tick in (1.0, 2.0, 3.0):
        parts.append(
            f'<line x1="{x(tick):.1f}" y1="32" x2="{x(tick):.1f}" y2="{height - 20}" stroke="#bbb" '
            f'stroke-dasharray="{"" if tick == 1.0 else "3,3"}"/>'
            f'<text x="{x(tick) - 10:.1f}" y="{height - 6}">{tick:.0f}x</text>'
        )
    for n, (backend, size, value) in enumerate(rows):
        y = 38 + n * _ROW
        parts.append(
            f'<text x="10" y="{y + 13}">{escape(backend)}, {size:,} messages</text>'
            f'<rect x="{_LEFT}" y="{y}" width="{x(value) - _LEFT:.1f}" height="{_ROW - 6}" fill="#4a7bb7"/>'
            f'<text x="{x(value) + 4:.1f}" y="{y + 13}">{value:.2f}x</text>'
        )
    parts.append("</svg>")
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")
    return len(rows)
