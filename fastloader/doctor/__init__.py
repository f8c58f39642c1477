"""`fastloader doctor`: measure a pipeline on the user's data, name its bottleneck and say what to do.

* ``diagnose.py``: run a DataLoaderX for a while (with a simulated training step) and collect its stage
  times, throughput over time, CPU per core, memory and GPU use, and the verdict;
* ``environment.py``: the traps of the machine (``/dev/shm``, open-files limit, CPU quota);
* ``storage.py``: sequential and random read speed of the dataset's source;
* ``report_html.py`` (charts in ``svg_charts.py``): the self-contained HTML report;
* ``bench.py``: torch's stock loader against DataLoaderX on the same data, as a ratio.
"""

from fastloader.doctor.bench import bench
from fastloader.doctor.checkup import checkup
from fastloader.doctor.report_html import write_report

__all__ = ["bench", "checkup", "write_report"]
