"""Exactly-once jobs, under the name users import (docs/jobs.md).

The recipe lives in `stockade.recipes.jobs`, beside the other recipes written over the public client;
this module keeps ``from stockade import jobs`` and ``stockade.jobs.once(...)`` working.
"""

from stockade.recipes.jobs import *  # noqa: F403
from stockade.recipes.jobs import __all__  # noqa: F401
