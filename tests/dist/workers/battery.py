"""Every distributed check, run in order by each rank of one MPI job.

:func:`run_checks` is what tests/dist/test_battery.py calls on every rank
(``mpiexec -n K python tests/dist/workers/battery.py`` runs it by hand).
After each check the ranks agree on its outcome, so one failing check does
not desynchronize the next (a check that hangs is ended by the test's
timeout). ``CHECKS`` (names only) is importable without MPI.
"""
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COMMUNICATORS = ('naive', 'flat', 'ring')
MODEL_CHECKS = ('closed_form', 'bcast_data', 'zero_fill', 'missing_grad_error',
                'layout_change', 'mismatch_error', 'uninitialized_bcast',
                'optimizer_wrapper', 'equivalence_mlp', 'equivalence_convnet',
                'equivalence_resnet_mnbn', 'negative_control_per_rank_bn',
                'negative_control_summed_loss',
                'unequal_batches_mnbn', 'equivalence_options',
                'equivalence_shard_state')
GENERIC_CHECKS = ('ranks_and_factory', 'array_collectives',
                  'object_collectives', 'send_recv', 'split', 'chunked',
                  'scatter_dataset', 'scatter_index', 'evaluate_weighted',
                  'mnbn_gradcheck', 'mnbn_matches_full_batch',
                  'mnbn_device_formula', 'mnbn_model_copy',
                  'local_errors_everywhere', 'collective_kinds_compared',
                  'header_persistent_request',
                  'join_uneven_shards', 'nan_check',
                  'mnbn_global_batch_of_one', 'mnbn_nan_refused_everywhere')
OVERLAP_CHECKS = ('overlap_equivalence_mlp',
                  'overlap_equivalence_mnbn_unequal',
                  'overlap_shared_and_unused', 'overlap_equals_plain',
                  'overlap_launches_during_backward',
                  'overlap_hashes_a_layout_once',
                  'accumulate_equals_large_batch',
                  'accumulate_equivalence_mnbn', 'overlap_transfer_float32',
                  'overlap_bucket_mismatch',
                  'overlap_model_change_in_backward',
                  'overlap_partial_gradients',
                  'overlap_second_backward_raises', 'overlap_join_uneven',
                  'accumulate_join_uneven',
                  'overlap_options_refused', 'overlap_timeline_events')
CHECKS = tuple('{}:{}'.format(c, n) for c in COMMUNICATORS
               for n in MODEL_CHECKS) + GENERIC_CHECKS + OVERLAP_CHECKS


def run_checks():
    """Run every check on this rank; returns ``{check: error text}`` of the
    checks that failed on some rank (the same on every rank), each text
    naming the ranks it failed on."""
    from minichain import dist
    import checks_model
    import checks_generic
    import checks_overlap
    comms = {name: dist.create_communicator(name) for name in COMMUNICATORS}
    world = comms['flat']
    failed = {}
    for name in CHECKS:
        if ':' in name:
            cname, check = name.split(':')
            fn, comm = getattr(checks_model, check), comms[cname]
        elif name in OVERLAP_CHECKS:
            fn, comm = getattr(checks_overlap, name), world
        else:
            fn, comm = getattr(checks_generic, name), world
        try:
            fn(comm)
            error = None
        except Exception:
            error = traceback.format_exc()
        errors = world.mpi_comm.allgather(error)
        if any(e is not None for e in errors):
            failed[name] = '\n'.join('rank {}: {}'.format(r, e) for r, e in
                                     enumerate(errors) if e is not None)
    return failed


if __name__ == '__main__':
    for check, text in run_checks().items():
        print('{} failed:\n{}'.format(check, text), file=sys.stderr)
