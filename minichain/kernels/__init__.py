"""The kernels layer: faster forwards (and updates) behind the kernel seam.

Installed by one line of ``minichain/__init__.py`` (``# layer: kernels``):
it adds four backends to the seam (:mod:`minichain.kernel_seam`), each a
package that registers its kernels when first used: ``onednn`` (oneDNN
through ctypes) and ``numpy`` (threaded NumPy) for NumPy arrays,
``cudnn`` (cuDNN through ctypes) and ``cuda`` (CuPy kernels) for CuPy
arrays, tried in that order. Delete this folder and its line, and
every op runs its body. ``kernels.register`` and the seam's other names are
here too, for kernel code and tests.
"""
import importlib

from minichain import kernel_seam
from minichain.kernel_seam import (  # noqa: F401 - the seam's names, here
    registry, backends_for, forward, parameters_changed,
    parameters_version, register, registered, update, UpdateAll)

for _name, _arrays in (('onednn', 'cpu'), ('numpy', 'cpu'), ('cudnn', 'gpu'),
                       ('cuda', 'gpu')):
    kernel_seam.add_backend(_name, _arrays, lambda name=_name: (
        importlib.import_module(__name__ + '.' + name)))


def on_cupy(arrays):
    """Whether ``arrays`` are all CuPy arrays, which the GPU kernels take
    (asked without importing CuPy)."""
    return all(type(a).__module__.startswith('cupy') for a in arrays)
