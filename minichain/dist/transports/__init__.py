"""Transports: faster ways to move the packed buffer's bytes on the CPU.

* :mod:`~minichain.dist.transports.shared_memory` -- ``SharedMemory``: with
  every rank on one machine, the packed buffer lives in a file that every
  rank maps, and the ranks sum it there, slice by slice.
* :mod:`~minichain.dist.transports.pipeline` -- ``Pipelined``: a packed host
  buffer summed in pieces of 4 MiB, each while still in cache.

Installed by one line of ``minichain/dist/__init__.py`` (both go in front
of every communicator, in this order). Without it the protocol sums the
packed buffer with one MPI ``Allreduce`` (flat.py); the plain transports,
MPI messages and NCCL, are the protocol's own (mpi.py, nccl.py).
"""
from minichain.dist import hooks
from minichain.dist.transports import pipeline, shared_memory

hooks.layers += [shared_memory.SharedMemory, pipeline.Pipelined]
