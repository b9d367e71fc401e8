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

Installed by one line of ``minichain/dist/__init__.py``: it fills the
protocol's ``hooks.span`` and ``hooks.mark`` with the timeline's and puts
``Traced`` in front of every communicator. Nothing in the protocol depends
on it; a student can skip it.
"""
from minichain.dist import hooks
from minichain.dist.trace import cost_model, timeline, traced

hooks.span, hooks.mark = timeline.span, timeline.mark
hooks.layers.append(traced.Traced)
hooks.names['explain'] = cost_model.explain
