"""LogReport: averaged observations appended to a JSON log file."""
import json
import math
import os

from minichain import backend
from minichain.reporter import DictSummary
from minichain.serializers import atomic_write
from minichain.training import extension
from minichain.training.triggers import get_trigger

__all__ = ['LogReport']


def to_float(value):
    """A reported scalar (host or GPU) as a Python float."""
    return float(backend.to_cpu(value))


def _json_safe(entries):
    """The entries with inf and NaN as None (JSON has no such numbers:
    ``null`` keeps the file readable by any JSON reader)."""
    return [{k: None if isinstance(v, float) and not math.isfinite(v) else v
             for k, v in e.items()} for e in entries]


class LogReport(extension.Extension):
    """Averages the observation over each interval and logs the means.

    Called every iteration, it accumulates the observed values; when its own
    ``trigger`` fires it appends one entry ``{key: mean, 'epoch': ...,
    'iteration': ..., 'elapsed_time': ...}`` to ``log`` and rewrites
    ``out/<filename>`` as a JSON list of every entry so far. The file is
    replaced atomically (temporary file, then ``os.replace``), so a reader
    never sees half a file. A mean that is inf or NaN is written as
    ``null`` (the file stays valid JSON); ``log`` keeps the float.

    Args:
        keys: observation keys to log (None: all scalar ones).
        trigger: the logging interval, ``(1, 'epoch')`` by default.
        postprocess: called with each entry (a dict) before it is stored;
            it may edit the entry.
        filename: the file under ``trainer.out``; None writes no file.
    """

    def __init__(self, keys=None, trigger=(1, 'epoch'), postprocess=None,
                 filename='log'):
        self._keys = None if keys is None else list(keys)
        self._trigger = get_trigger(trigger)
        self._postprocess = postprocess
        self._filename = filename
        self._log = []
        self._summary = DictSummary()

    @property
    def log(self):
        """The list of entries logged so far."""
        return self._log

    def __call__(self, trainer):
        observation = trainer.observation
        if self._keys is not None:
            observation = {k: observation[k] for k in self._keys
                           if k in observation}
        self._summary.add(observation)
        # Called before training (call_before_training): log epoch 0 now.
        if not (trainer.is_before_training or self._trigger(trainer)):
            return
        entry = {k: to_float(v)
                 for k, v in self._summary.compute_mean().items()}
        updater = trainer.updater
        entry['epoch'] = updater.epoch
        entry['iteration'] = updater.iteration
        entry['elapsed_time'] = trainer.elapsed_time
        if self._postprocess is not None:
            self._postprocess(entry)
        self._log.append(entry)
        if self._filename is not None:
            path = os.path.join(trainer.out, self._filename)
            with atomic_write(path, 'w') as f:
                json.dump(_json_safe(self._log), f, indent=4,
                          allow_nan=False)
        self._summary = DictSummary()

    def serialize(self, serializer):
        """Save or load the log, the partial interval and the trigger."""
        if hasattr(self._trigger, 'serialize'):
            self._trigger.serialize(serializer['_trigger'])
        self._summary.serialize(serializer['_summary'])
        self._log = json.loads(serializer('_log', json.dumps(
            _json_safe(self._log), allow_nan=False)))
