"""The benchmark table's old address: it lives in coreecg/eval/tables/benchmark.py; these names
stay importable from here."""
from coreecg.eval.tables.benchmark import (BENCHMARK_TABLE, ENCODER_KEYS, ENCODER_REASON, MODE_NAMES,  # noqa: F401
                                           MODE_OF, MODES, BenchmarkTable, Published, PublishedError,
                                           benchmark_allowance, benchmark_table, cell_text, check_benchmark,
                                           load_published, table_markdown, write_benchmark)
