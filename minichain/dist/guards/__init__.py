"""Guards: what keeps a data-parallel job from hanging or silently diverging.

* :mod:`~minichain.dist.guards.guarded` -- the layer: ``Guarded``, put in
  front of a communicator class by ``create_communicator``, swaps the
  protocol's wire, header and gradient plan for the guarded ones below.
* :mod:`~minichain.dist.guards.agreement` -- the header every collective
  opens with (kind, sequence number, sizes), so that ranks calling
  different collectives fail with a message instead of hanging.
* :mod:`~minichain.dist.guards.safety` -- the model check, the NaN stop and
  the abort-on-exception hook.
* :mod:`~minichain.dist.guards.watchdog` (with ``stall_notes``) -- no rank
  waits forever: every MPI wait is polled under a stall timeout.

Installed by one line of ``minichain/dist/__init__.py``: ``Guarded`` goes
in front of every communicator. The protocol (``flat.py``,
``communicator_base.py``) works without it (``create_communicator(name,
layers=())``, or this folder deleted); a student can skip it at first.
"""
from minichain.dist import hooks
from minichain.dist.guards import agreement, guarded, safety

hooks.layers.append(guarded.Guarded)
hooks.names.update(
    CollectiveMismatchError=agreement.CollectiveMismatchError,
    ModelMismatchError=safety.ModelMismatchError,
    check_same_model=safety.check_same_model,
    set_abort_on_exception=safety.set_abort_on_exception)
