"""minichain.optimizers: gradient methods, one per file.

Each optimizer is a ``GradientMethod`` whose ``UpdateRule`` updates one
parameter in place on the parameter's own device (NumPy or CuPy).
"""
from minichain.optimizers.sgd import SGD  # noqa: F401
from minichain.optimizers.momentum_sgd import MomentumSGD  # noqa: F401
from minichain.optimizers.adam import Adam  # noqa: F401
from minichain.optimizers.rmsprop import RMSprop  # noqa: F401

__all__ = ['SGD', 'MomentumSGD', 'Adam', 'RMSprop']
