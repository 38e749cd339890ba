"""The real toolchain in the loop: read hb_mapper's conversion log, compare it with the
simulation, run verification commands on a study's best trials and feed the results back."""

from tuner.toolchain.hblog import HbLog, Int16Event, NodeRecord, OutputRecord, parse_log, read_log

__all__ = ["HbLog", "Int16Event", "NodeRecord", "OutputRecord", "parse_log", "read_log"]
