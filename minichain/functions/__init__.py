"""minichain.functions (imported as F): every differentiable operation.

One family file each; a family lists its public names in ``__all__``.
"""
from minichain.functions.basic_math import *  # noqa: F401,F403
from minichain.functions.array import *  # noqa: F401,F403
from minichain.functions.join import *  # noqa: F401,F403
from minichain.functions.reduction import *  # noqa: F401,F403
from minichain.functions.math import *  # noqa: F401,F403
from minichain.functions.activation import *  # noqa: F401,F403
from minichain.functions.loss import *  # noqa: F401,F403
from minichain.functions.evaluation import *  # noqa: F401,F403
from minichain.functions.noise import *  # noqa: F401,F403
from minichain.functions.linear import *  # noqa: F401,F403
from minichain.functions.embed_id import *  # noqa: F401,F403
from minichain.functions.convolution import *  # noqa: F401,F403
from minichain.functions.pooling import *  # noqa: F401,F403
from minichain.functions.normalization import *  # noqa: F401,F403
from minichain.functions.basic_math import install_variable_operators

install_variable_operators()
del install_variable_operators
