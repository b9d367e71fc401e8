"""Run every distributed check in one MPI job: ``mpiexec -n K battery.py OUT``.

Each rank writes ``OUT/rank<r>.json``: ``{check name: None | error text}``.
After each check the ranks agree on its outcome, so one failing check does
not desynchronize the next (a check that hangs is caught by the caller's
timeout). ``CHECKS`` (names only) is importable without MPI.
"""
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COMMUNICATORS = ('naive', 'flat')
MODEL_CHECKS = ('closed_form', 'bcast_data', 'zero_fill', 'missing_grad_error',
                'layout_change', 'mismatch_error', 'uninitialized_bcast',
                'optimizer_wrapper', 'equivalence_mlp', 'equivalence_convnet',
                'equivalence_resnet_mnbn', 'negative_control_per_rank_bn',
                'unequal_batches_mnbn')
GENERIC_CHECKS = ('ranks_and_factory', 'array_collectives',
                  'object_collectives', 'send_recv', 'split', 'chunked',
                  'scatter_dataset', 'scatter_index', 'evaluate_weighted',
                  'mnbn_gradcheck', 'mnbn_matches_full_batch',
                  'mnbn_device_formula', 'mnbn_model_copy',
                  'local_errors_everywhere', 'collective_kinds_compared',
                  'join_uneven_shards', 'nan_check',
                  'mnbn_global_batch_of_one')
CHECKS = tuple('{}:{}'.format(c, n) for c in COMMUNICATORS
               for n in MODEL_CHECKS) + GENERIC_CHECKS


def main(out_dir):
    import faulthandler
    # A hung rank prints where it waits before the caller's timeout hits.
    limit = float(os.environ.get('BATTERY_DUMP_AFTER', '0'))
    if limit > 0:
        faulthandler.dump_traceback_later(limit, exit=True)
    from minichain import dist
    import checks_model
    import checks_generic
    comms = {name: dist.create_communicator(name) for name in COMMUNICATORS}
    world = comms['flat']
    results = {}
    for name in CHECKS:
        if ':' in name:
            cname, check = name.split(':')
            fn, comm = getattr(checks_model, check), comms[cname]
        else:
            fn, comm = getattr(checks_generic, name), world
        print('[rank {}] check {}'.format(world.rank, name), file=sys.stderr,
              flush=True)
        try:
            fn(comm)
            error = None
        except Exception:
            error = traceback.format_exc()
        errors = world.mpi_comm.allgather(error)
        results[name] = None if all(e is None for e in errors) else (
            '\n'.join('rank {}: {}'.format(r, e) for r, e in enumerate(errors)
                      if e is not None))
    with open(os.path.join(out_dir, 'rank{}.json'.format(world.rank)),
              'w') as f:
        json.dump(results, f)


if __name__ == '__main__':
    main(sys.argv[1])
