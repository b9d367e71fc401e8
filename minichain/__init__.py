"""minichain: a minimal define-by-run autodiff framework with data-parallel
training over MPI and NCCL, shaped like Chainer + ChainerMN."""
import sys

from minichain import backend, host  # noqa: F401
from minichain.configuration import (config, using_config,  # noqa: F401
                                     no_backprop_mode, force_backprop_mode,
                                     get_dtype, mixed16)
from minichain.variable import Variable, Parameter, as_variable  # noqa: F401
from minichain.function_node import FunctionNode  # noqa: F401
from minichain import functions  # noqa: F401
from minichain.link import Link, Chain, ChainList  # noqa: F401
from minichain.sequential import Sequential  # noqa: F401
from minichain import initializers, links  # noqa: F401
from minichain.optimizer import Optimizer  # noqa: F401
from minichain import optimizers, optimizer_hooks  # noqa: F401
from minichain import serializers  # noqa: F401
from minichain.reporter import report, Reporter, report_scope  # noqa: F401
from minichain.device import get_device  # noqa: F401
from minichain import datasets, iterators, training, dataset  # noqa: F401
from minichain import kernels  # layer: kernels
# Chainer's module paths chainer.backends.cuda and chainer.cuda (one
# module), also chainer.backend.cuda; chainer.serializer, chainer.utils.
from minichain import backends  # noqa: F401
from minichain.backends import cuda  # noqa: F401
from minichain import serializer, utils  # noqa: F401
sys.modules[__name__ + '.cuda'] = backend.cuda = cuda
disable_experimental_feature_warning = False  # read by utils.experimental

__version__ = '0.1.0'
