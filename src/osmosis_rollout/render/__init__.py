"""Pure functions from results to Rich renderables; commands print them on their console.

Nothing here prints or reads the terminal, so every report can be tested with a
``Console(file=io.StringIO())``. Internal: what the commands print, not an API.
"""

from .results import format_ms, results_table, summary_table
from .validation import validation_report

__all__ = ["format_ms", "results_table", "summary_table", "validation_report"]
