"""Snowflake ids with leased worker numbers, under the name users import (docs/ids.md).

The recipe lives in `stockade.recipes.ids`, beside the other recipes written over the public client;
this module keeps ``from stockade.ids import IdGenerator`` working.
"""

from stockade.recipes.ids import *  # noqa: F403
from stockade.recipes.ids import __all__  # noqa: F401
