"""Exactly-once output: the job's output rows are staged with their trees and committed for the deliveries that ACKED.

``SourcePipeline(..., output=FileOutput("out/", partition_by=["day"]))`` and a
job that returns its output DataFrame (rows anchored to their records, as
bolts emit them): the executors stage each Arrow batch of it under the
checkpoint, durably, then ack it (:mod:`.stager`); the driver commits the rows
of the trees that ACKED, one copy each, with Spark's own writer, once per
round or at the end of the run, and a commit survives a driver killed during
it (:mod:`.commits`, :mod:`.destinations`).
"""

from .commits import OutputCommits
from .destinations import BatchOutput, FileOutput, Output, TableOutput, published_files
from .stager import OutputStager, UnanchoredOutput
from .stream import StreamOutput

__all__ = [
    "BatchOutput",
    "FileOutput",
    "Output",
    "OutputCommits",
    "OutputStager",
    "StreamOutput",
    "TableOutput",
    "UnanchoredOutput",
    "published_files",
]
