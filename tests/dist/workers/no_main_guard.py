"""A script without ``if __name__ == '__main__':`` that reads batches with a
MultiprocessIterator: each worker re-runs it, communicator included."""
import numpy

from minichain import dist
from minichain.iterators import MultiprocessIterator

comm = dist.create_communicator('flat')
data = numpy.arange(40, dtype=numpy.float32).reshape(20, 2)
it = MultiprocessIterator(data, 4, n_processes=1)
print('rank {} read {}'.format(comm.rank, next(it).shape), flush=True)
it.finalize()
