"""The NumPy kernels: the ops' fast CPU versions, registered at import.

Each module here registers, for the ops of the ``minichain/functions`` file
of the same name, a kernel that computes what the op's body computes,
faster: minichain's own threads (``_parallel.py``, ``minichain.host``),
memory layouts that save passes (``_layout.py``: channel-major
activations). The underscored modules are those tools; the ops never
import them (``tests/kernels`` walks the imports to be sure).
"""
from minichain.kernels.numpy import (  # noqa: F401  (they register)
    basic_math, convolution, linear, normalization, pooling)
