"""`pzq bench`: the benchmark (native.py), its worker processes (workers.py) and its report (report.py)."""
