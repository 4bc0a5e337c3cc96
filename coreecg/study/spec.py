"""A study file (`studies/*.yaml`) and the validated study, by their old address: the file's
schema is coreecg/study/schema.py, the study and its runs coreecg/study/plan.py, reading and
validating coreecg/study/reader.py, the checks before Ray coreecg/study/checks.py. These names
stay importable from here.
"""
from coreecg.eval.tables.benchmark import BENCHMARK_TABLE  # noqa: F401
from coreecg.eval.tables.label_efficiency import LABEL_EFFICIENCY_TABLE  # noqa: F401
from coreecg.eval.tables.methods import BUILT_IN_TABLES  # noqa: F401
from coreecg.override_paths import PATH_KEYS, absolute_overrides  # noqa: F401
from coreecg.study.checks import check_fair_tables, check_run_configs  # noqa: F401
from coreecg.study.checks import config_or_error as _config  # noqa: F401
from coreecg.study.plan import (CorpusSpec, ExternalEncoder, FinetuneRun, Grid, MaskRates,  # noqa: F401
                                PretrainCorpus, PretrainRun, RandomEncoder, Study, fraction_label, slug)
from coreecg.study.reader import StudyReader, load_study, study_from_dict  # noqa: F401
from coreecg.study.schema import (FIGURES, MODES, CorpusEntry, DownstreamSection, Fractions,  # noqa: F401
                                  GridEntry, MaskRatesSection, Modes, Names, Overrides, PretrainCorpusEntry,
                                  PretrainSection, ReportSection, Seeds, StudyError, StudyFile, write_study_file)
