"""minichain.training.extensions: what the Trainer does around iterations.

Evaluation (Evaluator), logging (LogReport, PrintReport, ProgressBar,
PlotReport, observe_value, observe_lr, MicroAverage), the graph
(DumpGraph, also as dump_graph), snapshots (snapshot, snapshot_object;
extend_snapshots and parse_interval for snapshots between epochs) and
hyper-parameter schedules (ExponentialShift, LinearShift,
WarmupDecayShift).
"""
from minichain.training.extensions.dump_graph import DumpGraph  # noqa: F401
from minichain.training.extensions.evaluator import Evaluator  # noqa: F401
from minichain.training.extensions.log_report import LogReport  # noqa: F401
from minichain.training.extensions.micro_average import (  # noqa: F401
    MicroAverage)
from minichain.training.extensions.print_report import (  # noqa: F401
    PrintReport)
from minichain.training.extensions.progress_bar import (  # noqa: F401
    ProgressBar)
from minichain.training.extensions.plot_report import PlotReport  # noqa
from minichain.training.extensions._snapshot import (  # noqa: F401
    Snapshot, snapshot, snapshot_object)
from minichain.training.extensions.snapshot_schedule import (  # noqa
    extend_snapshots, parse_interval)
from minichain.training.extensions.shifts import (  # noqa: F401
    ExponentialShift, LinearShift, WarmupDecayShift)
from minichain.training.extensions.value_observation import (  # noqa: F401
    observe_lr, observe_value)

dump_graph = DumpGraph  # Chainer's older name, still used by its examples
