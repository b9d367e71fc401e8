"""A rank that leaves while the communicator is a local of ``main()``
(the ``sys.exit(main())`` shape of models/train_resnet50.py): rank 1
returns after the first allreduce, the others begin a second one and must
hear that it left (the watchdog's exit note), not wait out the timeout."""
import sys

import numpy

from minichain import dist


def main():
    comm = dist.create_communicator('flat')
    comm.allreduce(numpy.ones(3))
    if comm.rank == 1:
        return 3  # the communicator goes with this frame
    comm.allreduce(numpy.ones(3))
    print('[rank {}] done'.format(comm.rank), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
