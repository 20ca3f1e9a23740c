"""The fenced shard log, under the name users import (docs/shard-log.md).

The recipe lives in `stockade.recipes.log`, beside the other recipes; this module keeps
``from stockade.resources.log import SQLiteShardLog`` working.
"""

from stockade.recipes.log import *  # noqa: F403
from stockade.recipes.log import __all__  # noqa: F401
