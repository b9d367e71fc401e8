"""Transports: how bytes move between ranks, below the protocol.

* :mod:`~minichain.dist.transports.mpi` -- the lazy mpi4py import, tags.
* :mod:`~minichain.dist.transports.collectives` -- array and object
  collectives (bcast, gather, allreduce of host arrays) every communicator
  shares.
* :mod:`~minichain.dist.transports.packing` -- gradients into one
  contiguous buffer and back.
* :mod:`~minichain.dist.transports.pipeline` -- the layer ``Pipelined``:
  a packed host buffer summed in pieces of 4 MiB, each while in cache.
* :mod:`~minichain.dist.transports.nccl` -- what the NCCL communicators
  share: the NCCL module, its dtypes, the bfloat16 codec, the
  one-GPU-per-rank check.
* :mod:`~minichain.dist.transports.mpi_buckets`,
  :mod:`~minichain.dist.transports.nccl_buckets` -- the buckets of an
  overlapped averaging over MPI and NCCL.
* :mod:`~minichain.dist.transports.shm_files` -- MPICH's shared-memory
  files, unlinked early.
"""
