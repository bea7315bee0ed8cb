"""Partitioners: split a joint forward+backward graph into a forward and a backward graph.

See ``graph_split`` for the contract every partitioner follows, ``save_all`` and ``min_cut``
for the two strategies.
"""

from kiln_aot.partition.graph_split import saved_bytes, split_with_saved
from kiln_aot.partition.min_cut import min_cut_partition
from kiln_aot.partition.save_all import save_all_partition

__all__ = ["min_cut_partition", "save_all_partition", "saved_bytes", "split_with_saved"]
