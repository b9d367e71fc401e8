"""Updaters: what one training iteration does."""
from minichain.training.updaters.standard_updater import (  # noqa: F401
    StandardUpdater)
