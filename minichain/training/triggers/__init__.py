"""Triggers: callables ``trigger(trainer) -> bool`` that decide when an
extension runs and when training stops (``StopOnSignal``: also on a batch
system's stop signal, noted by ``catch_stop_signals``)."""
from minichain.training.triggers.interval_trigger import (  # noqa: F401
    IntervalTrigger, get_trigger)
from minichain.training.triggers.manual_schedule_trigger import (  # noqa
    ManualScheduleTrigger)
from minichain.training.triggers.minmax_value_trigger import (  # noqa: F401
    BestValueTrigger, MaxValueTrigger, MinValueTrigger)
from minichain.training.triggers.stop_on_signal import (  # noqa: F401
    StopOnSignal, catch_stop_signals)
