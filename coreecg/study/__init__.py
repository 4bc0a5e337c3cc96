"""Studies: the paper's experiment section as one YAML file (spec), run as Ray Tune trials with
resumption (runner), and reported as tables and figures with their runs (report)."""
