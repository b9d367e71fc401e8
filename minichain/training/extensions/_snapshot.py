"""snapshot and snapshot_object: save the trainer (or any object) to a file."""
import contextlib
import numbers
import os

from minichain.serializers import DictionarySerializer
from minichain.training import extension
from minichain.training.extensions import _snapshot_files
from minichain.training.extensions._snapshot_files import stale_temporaries

__all__ = ['Snapshot', 'snapshot', 'snapshot_object', 'stale_temporaries']


def _default_savefun(path, obj):
    from minichain.serializers import save_npz
    save_npz(path, obj)


class Snapshot(extension.Extension):
    """Saves ``target`` (the trainer when None) to ``out/<filename>``.

    ``filename`` is formatted with the trainer (``'{.updater.iteration}'``
    is the iteration). The file is written under a temporary name in the
    same folder and renamed over the destination (``os.replace``), so an
    interrupted save never leaves a truncated snapshot.

    With ``n_retains``, each save then deletes the older files of this
    pattern in the folder (by modification time) so that ``n_retains`` are
    left, the one just written always among them.

    Args:
        target: the object to save (None: the trainer).
        filename: the file name pattern.
        savefun: ``savefun(path, obj)`` (default ``serializers.save_npz``).
        n_retains: after each save, delete all but the newest ``n_retains``
            files that ``filename`` matches (see ``_snapshot_files``); None
            or negative keeps every file.
        autoload: when training starts (``initialize``), load the newest
            matching file in ``trainer.out``, if any, into the target with
            ``serializers.load_npz``: a restarted job goes on where it
            stopped.
        condition: ``condition()`` is asked at each trigger; a snapshot is
            written only when it returns True (None: always).
        writer: Chainer's writer protocol: ``writer(name, out, arrays)``
            writes ``arrays`` (the target as a ``{key: array}`` dict) itself,
            instead of ``savefun`` (e.g. in a thread of its own; with
            ``n_retains``, the older files are deleted when it returns).

    Attributes:
        last_iteration: the iteration of the last snapshot written (None
            before the first).
    """

    trigger = (1, 'epoch')
    priority = extension.PRIORITY_SNAPSHOT

    def __init__(self, target=None, filename='snapshot_iter_{.updater.'
                 'iteration}', savefun=None, n_retains=None, autoload=False,
                 condition=None, writer=None):
        if savefun is not None and writer is not None:
            raise TypeError('snapshot: give savefun or writer, not both')
        self._target = target
        self.filename = filename
        self._savefun = savefun or _default_savefun
        self.condition, self.writer = condition, writer
        if n_retains is not None:
            if (not isinstance(n_retains, numbers.Integral)
                    or isinstance(n_retains, bool) or n_retains == 0):
                raise ValueError('snapshot: n_retains must be at least 1, an '
                                 'int (None or Chainer\'s -1 keeps every '
                                 'file), got {!r}'.format(n_retains))
            if n_retains < 0:  # Chainer's default, -1: keep every file
                n_retains = None
        if n_retains is not None or autoload:
            _snapshot_files.check_pattern('snapshot', filename)
        self.n_retains = n_retains
        self.autoload = bool(autoload)
        self.autoloaded = None  # the file autoload read, if any
        self.last_iteration = None

    def initialize(self, trainer):
        """With ``autoload``, load the newest matching snapshot, if any."""
        if not self.autoload:
            return
        path = _snapshot_files.newest(trainer.out, self.filename)
        if path is not None:
            from minichain.serializers import load_npz
            load_npz(path, trainer if self._target is None else self._target)
            self.autoloaded = path

    @property
    def target(self):
        """The object saved (None: the trainer)."""
        return self._target

    @property
    def default_name(self):
        """'snapshot' for the trainer, 'snapshot_object' otherwise."""
        return 'snapshot' if self._target is None else 'snapshot_object'

    def __call__(self, trainer):
        if self.condition is not None and not self.condition():
            return
        target = trainer if self._target is None else self._target
        name = self.filename.format(trainer)
        path = os.path.join(trainer.out, name)
        if self.writer is not None:
            arrays = DictionarySerializer()
            arrays.save(target)
            self.writer(name, trainer.out, arrays.target)
        else:
            self._save(target, path)
        self.last_iteration = trainer.updater.iteration
        if self.n_retains is not None:
            _snapshot_files.remove_stale(trainer.out, self.filename,
                                         self.n_retains, path)

    def _save(self, target, path):
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, '.{}.{}.tmp'.format(os.path.basename(path),
                                                       os.getpid()))
        try:
            self._savefun(tmp, target)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def snapshot(filename='snapshot_iter_{.updater.iteration}', savefun=None,
             target=None, n_retains=None, autoload=False, *, condition=None,
             writer=None):
    """An extension that saves the whole trainer (model, optimizer,
    iterators, updater, extensions) every epoch by default.

    Resume with ``serializers.load_npz(path, trainer)`` on a trainer built
    the same way, before ``trainer.run()``.

    Args:
        filename: file name pattern, formatted with the trainer.
        savefun: ``savefun(path, obj)``; default ``serializers.save_npz``.
        target: save this object instead of the trainer.
        n_retains: keep only the newest ``n_retains`` snapshot files (None:
            all).
        autoload: resume from the newest snapshot file in ``trainer.out``
            when training starts, if there is one.
        condition, writer: see :class:`Snapshot`.
    """
    return Snapshot(target, filename, savefun, n_retains, autoload,
                    condition, writer)


def snapshot_object(target, filename, savefun=None, n_retains=None,
                    autoload=False):
    """An extension that saves ``target`` (e.g. the model) to
    ``out/<filename>`` (formatted with the trainer), every epoch by
    default; ``n_retains`` and ``autoload`` as for :func:`snapshot`."""
    return Snapshot(target, filename, savefun, n_retains, autoload)
