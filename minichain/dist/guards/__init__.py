"""Guards: what keeps a data-parallel job from hanging or silently diverging.

* :mod:`~minichain.dist.guards.agreement` -- the header every collective
  opens with (kind, sequence number, sizes), so that ranks calling
  different collectives fail with a message instead of hanging.
* :mod:`~minichain.dist.guards.safety` -- the model check, the NaN stop and
  the abort-on-exception hook.
* :mod:`~minichain.dist.guards.watchdog` (with ``stall_notes``) -- no rank
  waits forever: every MPI wait is polled under a stall timeout.

The protocol (``flat.py``, ``communicator_base.py``) works without them; a
student can skip this folder on first reading.
"""
