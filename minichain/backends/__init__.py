"""minichain.backends: Chainer's ``chainer.backends`` module path.

Only ``cuda`` is here (``chainer.backends.cuda``, also reachable as
``minichain.cuda``, as ``chainer.cuda`` is), a thin layer over
:mod:`minichain.backend` for scripts written against Chainer. New code uses
``minichain.backend`` and ``minichain.get_device`` directly.
"""
from minichain.backends import cuda  # noqa: F401
