"""The label-efficiency table's old address: it lives in coreecg/eval/tables/label_efficiency.py
(and what it can detect in coreecg/eval/tables/detectable.py); these names stay importable from
here."""
from coreecg.eval.tables.detectable import detectable_note, detectable_summary, run_sd  # noqa: F401
from coreecg.eval.tables.label_efficiency import (LABEL_EFFICIENCY_TABLE, LEADS, MODES, SUFFIX, UNDER,  # noqa: F401
                                                  VERDICT_METRIC, VERDICTS_FILE, LabelEfficiencyTable, Row,
                                                  difference_list, difference_text, extra_tables,
                                                  has_label_efficiency_runs, is_random_init,
                                                  label_efficiency_differences, label_efficiency_rows,
                                                  label_efficiency_runs, label_efficiency_table, row_name,
                                                  verdicts, verdicts_markdown, write_label_efficiency)
