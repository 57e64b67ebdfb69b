"""The merge level between tokenize and order: with more parts than `[build] merge_fan_in`, merge
tasks merge groups of consecutive parts' entries into runs, round after round, until at most
that many are left, so an order task reads at most `merge_fan_in` entries objects however many
parts the corpus has (docs/build.md, "merge").

Merging changes no output: an order task's key does not name what it read, and its bucket is
the same from runs as from parts. The runs are not part of the snapshot either: merge tasks
keep task records (a rerun after a crash redoes only uncommitted merges), which no snapshot
names, so gc collects them and their runs once past the grace period.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prep.progress import plural
from prep.runner.tasks import MergeJob, PartRef, run_merge_job
from prep.store import records

if TYPE_CHECKING:
    from prep.runner.build import Builder


@dataclass(frozen=True)
class Source:
    """An entries object the order stage reads: a part's or a run's, with the ordinal of its
    first part and how many documents it holds."""

    object_id: str
    first_part: int
    documents: int


def order_sources(builder: Builder, parts: tuple[PartRef, ...]) -> tuple[Source, ...]:
    """The parts' entries objects, merged in rounds into at most `merge_fan_in` runs when there
    are more; each round's tasks run (or are found committed) before the next is planned."""
    fan_in = builder.pipeline.build.merge_fan_in
    level = tuple(Source(part.entries_id, ordinal, part.documents) for ordinal, part in enumerate(parts))
    rounds = 0
    while len(level) > fan_in:
        rounds += 1
        ran_before = builder.stages["merge"].ran if "merge" in builder.stages else 0
        groups = [level[first:end] for first, end in merge_groups(len(level), fan_in)]
        jobs = {index: _merge_job(builder, group) for index, group in enumerate(groups) if len(group) > 1}
        builder.progress.stage("merge", f"round {rounds}: {plural(len(level), 'entries object')} into "
                                        f"{plural(len(groups), 'run')}")
        done = builder.run_tasks("merge", list(jobs.values()), run_merge_job,
                                 describe=lambda job: f"merge of {plural(len(job.inputs), 'entries object')}",
                                 reads=[[object_id for _, job in jobs.values() for object_id, _ in job.inputs]],
                                 weight=lambda job: job.documents,
                                 inputs_of=lambda job: [object_id for object_id, _ in job.inputs])
        level = tuple(Source(done[jobs[index][0]].outputs["run"], group[0].first_part, jobs[index][1].documents)
                      if index in jobs else group[0] for index, group in enumerate(groups))
        ran = builder.stages["merge"].ran - ran_before
        builder.progress.done("merge", f"round {rounds}: {plural(ran, 'task')} run, {len(jobs) - ran} cached")
    if rounds:  # the build log's key of the merge: what it made
        builder.stage_key("merge", {"fan_in": fan_in}, [[source.object_id, source.first_part] for source in level])
    return level


def _merge_job(builder: Builder, group: tuple[Source, ...]) -> tuple[str, MergeJob]:
    """A merge task of one group and its key: what it merges, numbered from the group's first part."""
    inputs = tuple((source.object_id, source.first_part - group[0].first_part) for source in group)
    key = records.content_key("merge", {"entries": "prep.entries/1"}, builder.code, [list(item) for item in inputs])
    return key, MergeJob(builder.store.url, inputs, sum(source.documents for source in group))


def merge_groups(count: int, fan_in: int) -> list[tuple[int, int]]:
    """(first, end) of each group of consecutive inputs one merge round makes runs of: the fewest
    groups of at most `fan_in`, their sizes within one of each other (the data decides them,
    never the workers)."""
    if fan_in < 2:
        raise ValueError(f"a merge fan-in of {fan_in}")
    groups = -(-count // fan_in)
    bounds = [count * index // groups for index in range(groups + 1)] if groups else [0]
    return list(zip(bounds[:-1], bounds[1:]))
