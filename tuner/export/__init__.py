"""Write a candidate as the hb_mapper YAML the real tool will accept."""

from tuner.export.hb_yaml import check_rules, dump_yaml, merged_config, write_atomic

__all__ = ["check_rules", "dump_yaml", "merged_config", "write_atomic"]
