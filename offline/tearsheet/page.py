"""The page: a sheet rendered as one self-contained HTML file, and the definitions under it."""

from __future__ import annotations

import html
from pathlib import Path

from offline.tearsheet.sections import SECTION_WRITERS
from offline.tearsheet.sheet import DEFINITIONS, SECTIONS, Sheet, paragraph, table_html
from persistence import committing

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;max-width:1200px;
margin:0 auto;padding:1rem 1.5rem 3rem;color:#1d1d1f;line-height:1.45;background:#fff}
h1{font-size:1.6rem;margin-bottom:.3rem}h2{margin-top:2.5rem;border-bottom:2px solid #1d1d1f;padding-bottom:.2rem}
h3{margin-top:1.8rem}.note{color:#555;font-size:.92rem}.lead{margin:.2rem 0}
table{border-collapse:collapse;margin:.6rem 0 1.2rem;font-size:.86rem;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:.3rem 0}
th,td{padding:.2rem .45rem;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
thead th{border-bottom:2px solid #999;vertical-align:bottom;white-space:normal}
tbody th,thead th:first-child{text-align:left;font-weight:600;white-space:normal}
.scroll{overflow-x:auto}td.neg{color:#b3261e}
figure{margin:1rem 0}img{display:block;max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.88rem;margin-top:.3rem}nav ul{columns:2;font-size:.92rem}
dt{font-weight:600;margin-top:.5rem}dd{margin-left:1.2rem}
"""

_DEFINITIONS = (
    ("Returns", "Daily log returns net of costs; total return is exp(sum) - 1, the growth of 1 over the days."),
    (
        "Annualised",
        "With 252 trading days a year: annual return exp(mean log return x 252) - 1, volatility and ratios times "
        "sqrt(252). A figure from fewer than 252 days says 'annualised from N days': a rate extrapolated from part "
        "of a year.",
    ),
    (
        "Sharpe ratio",
        "Mean over standard deviation (ddof 1) of the daily simple returns in excess of what cash earned the same "
        "day, times sqrt(252). Sortino: the same mean over the root mean square of the days below cash.",
    ),
    (
        "Drawdown",
        "1 - value / running peak. Days underwater: the days that closed below the last peak. Calmar: annual return "
        "over the maximum drawdown, shown for 252 days or more.",
    ),
    (
        "Turnover and costs",
        "Turnover: sum |target - held| each day, per year the mean times 252; costs are paid as "
        "cost rate x turnover, added up per unit of starting capital.",
    ),
    (
        "Alpha and beta",
        "Ordinary least squares of the champion's daily simple excess returns over cash on the benchmark's: beta the "
        "slope, alpha the intercept per day, annualised as (1 + alpha)^252 - 1 (pyfolio's convention).",
    ),
    (
        "Tracking error and information ratio",
        "Of the daily active return, the champion's simple return minus the benchmark's: tracking error its standard "
        "deviation (ddof 1) times sqrt(252), information ratio its mean over that deviation times sqrt(252).",
    ),
    (
        "Deflated Sharpe ratio and PBO",
        "How much of the champion's validation edge over equal weight the number of candidates tried explains "
        "(offline/overfitting.py; docs/backtest.md, section Skill or luck?).",
    ),
)


def _anchor(index: int, section: int | None = None) -> str:
    return f"part-{index}" if section is None else f"part-{index}-{section}"


def render(sheet: Sheet) -> str:
    """The page's HTML: the verdict, then each part's sections (``SECTIONS``), then the definitions."""
    labels = sheet.labels
    body = [f"<h1>{html.escape(sheet.title)}</h1>", *(paragraph(line, "lead") for line in sheet.lines)]
    links = [f'<li><a href="#verdict">{html.escape(sheet.verdict.heading)}</a></li>']
    links += [f'<li><a href="#{_anchor(i)}">{html.escape(part.title)}</a></li>' for i, part in enumerate(sheet.parts)]
    links.append(f'<li><a href="#definitions">{DEFINITIONS}</a></li>')
    body.append(f"<nav><ul>{''.join(links)}</ul></nav>")
    verdict = sheet.verdict
    body.append(f'<h2 id="verdict">{html.escape(verdict.heading)}</h2>')
    body += [paragraph(s) for s in verdict.sentences]
    body += [table_html(t) for t in verdict.tables]
    for i, part in enumerate(sheet.parts):
        body.append(f'<h2 id="{_anchor(i)}">{html.escape(part.title)}</h2>')
        body.append(paragraph(part.note))
        for k, (heading, write) in enumerate(zip(SECTIONS, SECTION_WRITERS)):
            body.append(f'<section><h3 id="{_anchor(i, k)}">{html.escape(heading)}</h3>{write(part, labels)}</section>')
    body.append(f'<h2 id="definitions">{DEFINITIONS}</h2><dl>')
    body += [f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in _DEFINITIONS]
    body.append("</dl>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(sheet.title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_page(path: Path, sheet: Sheet) -> str:
    """Write ``render(sheet)`` to ``path`` (replaced atomically); returns the file's name."""
    committing.write_file_atomically(path, render(sheet).encode("utf-8"))
    return path.name
