"""The jobs: thin command lines over coreecg. Run from a checkout (`python jobs/pretrain.py`) or,
installed, as commands (`coreecg-pretrain`; pyproject.toml's [project.scripts])."""
