import os
import subprocess
import sys
from pathlib import Path

import pytest

SETUP = """
import numpy as np
rng = np.random.default_rng(0)
docs = [rng.integers(2, 50, n) for n in rng.integers(5, 30, 64)]
from distattn.stats import cooccurrence
S = cooccurrence(docs, window=5, vocab_size=50)           # counting: Python threads, no numba pool
"""

# each runs a parallel numba kernel of the library, the first of the process
KERNELS = {
    "svd": "from distattn.stats import SVDEmbeddings, ppmi\n"
           "SVDEmbeddings(dim=8, algorithm='randomized').fit(ppmi(S))\n",
    "positional": "from distattn.projection import positional_distributions\n"
                  "from distattn.projection.positional import CorpusPositional\n"
                  "CorpusPositional(S, positional_distributions(docs, 50, 32))\n",
    "causal": "from distattn.projection import causal_scores\ncausal_scores(docs, S)\n",
    "next_token": "from distattn.projection import UnigramLM, evaluate_next_token\n"
                  "evaluate_next_token(UnigramLM().fit(docs, 50), docs)\n",
    "torch_rows": "from distattn.projection import torch_causal_scores\ntorch_causal_scores(docs, S)\n",
    "flow": "from distattn.analysis import attention_flow\n"
            "attention_flow(rng.dirichlet(np.ones(6), size=(3, 6)), method='dinic')\n",
}


@pytest.mark.parametrize("kernel,torch_first", [*((k, True) for k in KERNELS), ("svd", False), ("causal", False)])
def test_library_numba_kernels_keep_torch_thread_count(tmp_path, kernel, torch_first):
    """numba's OpenMP layer sets the calling thread's OpenMP thread count, torch's CPU thread count,
    to NUMBA_NUM_THREADS when its pool starts: a script that built statistics, scored a projection
    or computed attention flow before training trained on NUMBA_NUM_THREADS threads, overriding
    OMP_NUM_THREADS and the user's own torch.set_num_threads (torch_first) or, torch imported after,
    its default. numba's kernels keep their threads."""
    script = tmp_path / "threads.py"
    # torch used before (the thread count read, as by any op): torch would re-apply it on first use
    script.write_text(("import torch\ntorch.set_num_threads(1)\nassert torch.get_num_threads() == 1\n"
                       if torch_first else "")
                      + SETUP + KERNELS[kernel]
                      + "import numba, torch\n"
                        "import numba.np.ufunc.parallel as P\n"
                        "assert P._is_initialized, 'no numba pool was started'\n"
                        "print('TORCH', torch.get_num_threads(), 'NUMBA', numba.get_num_threads(), flush=True)\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="2", DISTATTN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert "TORCH 1 NUMBA 2" in res.stdout, res.stdout + res.stderr[-2000:]
