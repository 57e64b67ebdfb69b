"""Plan tasks, skip committed ones, execute them, and write commit records last.

The runner is the only layer that commits: a task's outputs become reachable only through its
commit record, and a stage's only through its stage record.
"""
