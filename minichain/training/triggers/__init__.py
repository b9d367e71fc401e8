"""Triggers: callables ``trigger(trainer) -> bool`` that decide when an
extension runs and when training stops."""
from minichain.training.triggers.interval_trigger import (  # noqa: F401
    IntervalTrigger, get_trigger)
from minichain.training.triggers.manual_schedule_trigger import (  # noqa
    ManualScheduleTrigger)
from minichain.training.triggers.minmax_value_trigger import (  # noqa: F401
    BestValueTrigger, MaxValueTrigger, MinValueTrigger)
