"""Reporting in the runner, split the way the numbers flow:

- tally.py: the intake. The workers' typed reports (appo/messages.py) summed per policy and per run, and the
  counts over time. Writes nothing.
- numbers.py: derived numbers. FPS and samples per second, progress and ETA, episode means, the best reward, a
  solved policy, PBT's objective.
- text.py (with formatting.py): the status printed every --report_interval and the summary at the end.
- summaries.py: each policy's scalars as one batch per write, handed to the Recorder of appo/tracking/ (tensorboard,
  and the JSONL file, W&B and MLflow when they are on); the learning curve drawn from them at the end.
- benchmark.py: the benchmark's summary, its table and the diagnosis of what limits throughput.
- reports.py: `Reports`, the one object the runner holds, which composes the others.
"""

from appo.run.reporting.benchmark import TIME_SHARES, diagnose, format_benchmark
from appo.run.reporting.formatting import LINE_WIDTH
from appo.run.reporting.reports import Reports

__all__ = ["LINE_WIDTH", "TIME_SHARES", "Reports", "diagnose", "format_benchmark"]
