"""The examples users copy: every ``>>>`` example in the package's docstrings, and every README
code block marked ``<!-- runs in tests/test_docs.py -->``, run as written."""

from __future__ import annotations

import doctest
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- runs in tests/test_docs.py -->"


def _modules_with_examples() -> list[str]:
    found = []
    for path in sorted((ROOT / "distattn").rglob("*.py")):
        if ">>>" in path.read_text(encoding="utf-8") and path.name != "__main__.py":
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def _readme_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(re.escape(MARK) + r"\s*```python\n(.*?)```", text, flags=re.S)


MODULES = _modules_with_examples()
BLOCKS = _readme_blocks()


def test_the_examples_are_found():
    """The collection below cannot pass by finding nothing."""
    assert {"distattn.projection", "distattn.models", "distattn.train", "distattn.corpus.paper"} <= set(MODULES)
    assert len(BLOCKS) == (ROOT / "README.md").read_text(encoding="utf-8").count(MARK) == 3


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name, tmp_path, monkeypatch, request):
    monkeypatch.chdir(tmp_path)             # examples may write runs/
    module = importlib.import_module(name)
    if 'get_corpus("imdb"' in (module.__doc__ or ""):
        request.getfixturevalue("imdb_archive")     # skipped without the archive, a failure under CI
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False,
                             report=True)
    assert result.attempted > 0, f"{name} has '>>>' but doctest found no example"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see stdout)"


def _run_block(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.mark.parametrize("index", [i for i, b in enumerate(BLOCKS) if "get_corpus(\"imdb\"" not in b])
def test_readme_example_runs(index, tmp_path):
    res = _run_block(BLOCKS[index], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip(), "the example prints what it computed"


def test_readme_projection_example_prints_the_papers_figures(tmp_path):
    block = next(b for b in BLOCKS if "load_paper_corpus" in b)
    first = _run_block(block, tmp_path).stdout.splitlines()[0]
    assert first == "[0.    0.444 0.556] shore"          # the comment beside the print in the README


@pytest.mark.imdb
@pytest.mark.slow
def test_readme_statistics_example_runs_on_imdb(imdb_archive, tmp_path):
    block = next(b for b in BLOCKS if "get_corpus(\"imdb\"" in b)
    res = _run_block(block, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    spearman = float(re.search(r"spearman=([0-9.]+)", res.stdout).group(1))
    assert 0.3 < spearman < 1.0, res.stdout       # PPMI-SVD on IMDB: related words rank high on WordSim-353


def test_the_train_docstring_states_the_seed_recipe_the_code_builds():
    """distattn.train's docstring gave the seed's recipe as ``TrainConfig(epochs=5, batch_size=64,
    lr=2e-4)``, which leaves TrainConfig's defaults in place: a cosine schedule, clipping at 1 and
    weight decay on matrices only, where the seed (and ``seed_train_config``) has a constant rate,
    no clipping and decay on every parameter."""
    import dataclasses

    import distattn.train
    from distattn.train import TrainConfig
    from distattn.train.recipes import seed_train_config
    stated = re.search(r"seed's recipe is[^`]*``(TrainConfig\(.*?\))``", distattn.train.__doc__, flags=re.S)
    assert stated, "the docstring no longer names the seed's recipe as a TrainConfig(...)"
    config = eval(" ".join(stated.group(1).split()), {"TrainConfig": TrainConfig})
    assert dataclasses.asdict(config) == dataclasses.asdict(seed_train_config())
