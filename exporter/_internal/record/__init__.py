"""Stage 2 of the data path, recording: what one call becomes, and where it is kept.

A finished call's stamps (`timeline`) are derived into values once, pass the label guard
(`guard`), and land in the process's store (`recorder`): one sparse HDR histogram per series
(`histogram`, `series`), the counter rows, and the agent tasks' figures (`tasks`). Nothing here
knows a format: exposition, push and the aggregator read the store through snapshots (`expose/`)
or through the store operations of their role (`fleet/`). Nothing here raises into the caller.
"""
