"""ChainerMN's comm.allreduce_grad(model): rank r's gradients are all r, so
every rank must end with (size - 1) / 2 everywhere, for each communicator
named on the command line."""
import sys

import numpy

from minichain import dist
from minichain import links as L

for name in sys.argv[1:]:
    comm = dist.create_communicator(name)
    model = L.Linear(3, 2)
    for param in model.params():
        param.grad = numpy.full(param.shape, comm.rank, numpy.float32)
    comm.allreduce_grad(model)
    for path, param in model.namedparams():
        numpy.testing.assert_array_equal(
            param.grad, numpy.full(param.shape, (comm.size - 1) / 2),
            err_msg='{} {}'.format(name, path))
    print('rank {} {}: ok'.format(comm.rank, name), flush=True)
