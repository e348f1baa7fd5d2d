"""The service holds numpy's BLAS to one thread (``service.__main__.one_blas_thread``)."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json

import numpy as np
from threadpoolctl import threadpool_info
from service.__main__ import one_blas_thread

before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
one_blas_thread()
after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(json.dumps([before, after]))
"""


def test_the_service_runs_numpys_blas_on_one_thread() -> None:
    # A fresh interpreter: the limit is process-wide, and the test process's own must not change.
    env = {"OPENBLAS_NUM_THREADS": "2", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, check=True)
    before, after = json.loads(out.stdout)
    assert before == [2], "the check needs a BLAS that starts on two threads"
    assert after == [1]
