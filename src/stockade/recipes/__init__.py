"""Recipes written over the public client, as kazoo's ``recipe/``: Snowflake ids (`ids`), exactly-once
jobs (`jobs`), the fenced shard log (`log`)."""
