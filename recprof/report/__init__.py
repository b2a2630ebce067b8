"""The HTML bottleneck report: `write_report(result, out, cdn)` (see docs/team-contracts.md)."""

from recprof.report.render import default_report_path, render_report, write_report

__all__ = ["default_report_path", "render_report", "write_report"]
