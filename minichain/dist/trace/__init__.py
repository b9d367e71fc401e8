"""Tracing: seeing where a data-parallel step spends its time.

* :mod:`~minichain.dist.trace.traced` -- the layer: ``Traced``, put in
  front of a communicator class by ``create_communicator``, times the
  protocol's steps (sync, pack, allreduce, unpack, bcast).
* :mod:`~minichain.dist.trace.timeline` -- spans per rank (compute, pack,
  reduce, wait) written as a Chrome trace (``MINICHAIN_TIMELINE``).
* :mod:`~minichain.dist.trace.timeline_plot` -- one step of a trace drawn
  as a PNG (``python -m minichain.dist.trace.timeline_plot``).
* :mod:`~minichain.dist.trace.cost_model` -- ``dist.explain``: the
  alpha-beta model of what a step should cost.

Nothing in the protocol depends on it being read; a student can skip it.
"""
