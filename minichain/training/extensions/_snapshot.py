"""snapshot and snapshot_object: save the trainer (or any object) to a file."""
import contextlib
import os

from minichain.training import extension

__all__ = ['Snapshot', 'snapshot', 'snapshot_object']


def _default_savefun(path, obj):
    from minichain.serializers import save_npz
    save_npz(path, obj)


class Snapshot(extension.Extension):
    """Saves ``target`` (the trainer when None) to ``out/<filename>``.

    ``filename`` is formatted with the trainer (``'{.updater.iteration}'``
    is the iteration). The file is written under a temporary name in the
    same folder and renamed over the destination (``os.replace``), so an
    interrupted save never leaves a truncated snapshot.

    Args:
        target: the object to save (None: the trainer).
        filename: the file name pattern.
        savefun: ``savefun(path, obj)`` (default ``serializers.save_npz``).
    """

    trigger = (1, 'epoch')
    priority = extension.PRIORITY_SNAPSHOT

    def __init__(self, target=None, filename='snapshot_iter_{.updater.'
                 'iteration}', savefun=None):
        self._target = target
        self._filename = filename
        self._savefun = savefun or _default_savefun

    @property
    def default_name(self):
        """'snapshot' for the trainer, 'snapshot_object' otherwise."""
        return 'snapshot' if self._target is None else 'snapshot_object'

    def __call__(self, trainer):
        target = trainer if self._target is None else self._target
        name = self._filename.format(trainer)
        path = os.path.join(trainer.out, name)
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
             target=None):
    """An extension that saves the whole trainer (model, optimizer,
    iterators, updater, extensions) every epoch by default.

    Resume with ``serializers.load_npz(path, trainer)`` on a trainer built
    the same way, before ``trainer.run()``.

    Args:
        filename: file name pattern, formatted with the trainer.
        savefun: ``savefun(path, obj)``; default ``serializers.save_npz``.
        target: save this object instead of the trainer.
    """
    return Snapshot(target, filename, savefun)


def snapshot_object(target, filename, savefun=None):
    """An extension that saves ``target`` (e.g. the model) to
    ``out/<filename>`` (formatted with the trainer), every epoch by
    default."""
    return Snapshot(target, filename, savefun)
