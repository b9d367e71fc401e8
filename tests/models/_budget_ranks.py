"""Run under mpiexec by test_train_budget: each rank measures with a clock
of its own (rank r's iterations take 1 + r seconds) and prints the length
that TimeBudget chose: every rank must print the slowest rank's."""
from minichain import dist
from tests.models.test_train_budget import _budget, _Clock, _iterate, \
    _trainer


def main():
    comm = dist.create_communicator('flat')
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock, comm=comm)
    budget.initialize(trainer)
    _iterate(budget, trainer, clock, 22, 1.0 + comm.rank)
    print('rank {}: {}'.format(comm.rank, budget.length.total), flush=True)


if __name__ == '__main__':
    main()
