"""A standalone SVG line plot written by hand (no plotting dependency): time per DiT step against tokens."""

from __future__ import annotations

from html import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def _ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top``."""
    raw = top / count
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    while magnitude > raw and magnitude > 1e-9:
        magnitude /= 10
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude * count >= top)
    return [step * i for i in range(count + 1)]


def line_plot(
    series: dict[str, list[tuple[float, float, str]]], title: str, x_label: str, y_label: str
) -> str:
    """``series``: name -> [(x, y, point label)]; one polyline with labelled markers per series."""
    width, height, left, right, top, bottom = 900, 560, 80, 200, 50, 60
    points = [p for values in series.values() for p in values]
    if not points:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="80"><text x="10" y="40">'
            f"{escape(title)}: no data</text></svg>\n"
        )
    x_ticks = _ticks(max(p[0] for p in points))
    y_ticks = _ticks(max(p[1] for p in points))
    plot_w, plot_h = width - left - right, height - top - bottom

    def sx(v: float) -> float:
        return left + plot_w * v / x_ticks[-1]

    def sy(v: float) -> float:
        return top + plot_h * (1 - v / y_ticks[-1])

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="28" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    for v in x_ticks:
        out.append(f'<line x1="{sx(v):.1f}" y1="{top}" x2="{sx(v):.1f}" y2="{top + plot_h}" stroke="#eee"/>')
        out.append(f'<text x="{sx(v):.1f}" y="{top + plot_h + 18}" text-anchor="middle">{v:g}</text>')
    for v in y_ticks:
        out.append(
            f'<line x1="{left}" y1="{sy(v):.1f}" x2="{left + plot_w}" y2="{sy(v):.1f}" stroke="#eee"/>'
        )
        out.append(f'<text x="{left - 8}" y="{sy(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 15}" text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(20 {top + plot_h / 2}) rotate(-90)" text-anchor="middle">'
        f"{escape(y_label)}</text>"
    )
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="6 4"' if "KV" in name else ""
        values = sorted(values)
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in values)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for x, y, label in values:
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{colour}">'
                f"<title>{escape(name)} {escape(label)}: {y:.3g}</title></circle>"
            )
            if i == 0:
                out.append(
                    f'<text x="{sx(x) + 5:.1f}" y="{sy(y) - 7:.1f}" font-size="10" fill="#555">'
                    f"{escape(label)}</text>"
                )
        ly = top + 18 * i + 10
        out.append(
            f'<line x1="{left + plot_w + 15}" y1="{ly}" x2="{left + plot_w + 45}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{left + plot_w + 50}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
