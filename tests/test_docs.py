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


TOP_LEVEL = {"distattn", "analyses", "benchmarks", "corpora", "tests", ".ci"}
RESULTS = ROOT / "benchmarks" / "results"


def _cited_paths(doc: Path) -> list[str]:
    """The repository files a README names in backticks: a path under one of the top-level
    directories, a bare ``*.py`` (a script of analyses/ or benchmarks/), and in the results README
    a measured output (``cpu_*``, ``h100_*``, ``models_h100_*``, ``projection_vs_ngrams_*``) or a
    file under one. Placeholders (``<dir>``, ``$OUT``, ``*``, ``…``) name no one file."""
    text = doc.read_text(encoding="utf-8")
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M)
    text = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
    cited = []
    for token in blocks + re.findall(r"`([^`]+)`", text):        # a code span may wrap a line
        for word in token.split():
            word = word.strip("(),;'\"")
            if not word or re.search(r"[<>$*…=]", word) or "://" in word:
                continue
            first = word.split("/")[0]
            if first in TOP_LEVEL and "/" in word:
                cited.append(word)
            elif "/" not in word and word.endswith(".py"):
                cited.append(word)
            elif doc.parent == RESULTS and re.match(r"(cpu|h100|models_h100|projection_vs_ngrams)_", first):
                cited.append(word)
    return cited


@pytest.mark.parametrize("doc", [ROOT / "README.md", RESULTS / "README.md"], ids=["README", "results README"])
def test_every_file_a_readme_cites_exists(doc):
    cited = _cited_paths(doc)
    assert len(cited) >= 10, cited                     # the extraction cannot pass by finding nothing
    missing = [p for p in cited
               if not any((base / p).exists() for base in ((ROOT, ROOT / "analyses", ROOT / "benchmarks")
                                                           if "/" not in p and p.endswith(".py") else (ROOT, RESULTS)))]
    assert not missing, f"{doc.relative_to(ROOT)} cites files that are not in the repository: {missing}"


def _readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(r"^## " + re.escape(title) + r"\n(.*?)(?=^## )", text, flags=re.S | re.M).group(1)


def _effective_default(action):
    """The parser's default, or where that is a placeholder (None) the one its help names."""
    if action.default is not None:
        return action.default
    named = re.search(r"\(default: ([^)]*)\)", action.help or "")
    return named.group(1) if named else None


@pytest.mark.parametrize("module", ["distattn.compare", "distattn.stats"])
def test_readme_option_tables_match_the_parsers(module):
    """Every option a README table names exists, with the default the parser uses; every option
    of the parser is named in its section (the table or the text around it)."""
    parser = importlib.import_module(module + ".__main__").parser()
    actions = {s: a for a in parser._actions for s in a.option_strings}
    section = _readme_section(f"`python -m {module}`")
    rows = re.findall(r"^\|\s*(`-[^|]*?)\s*\|\s*([^|]*?)\s*\|", section, flags=re.M)
    assert len(rows) >= 8, rows
    for names_cell, default_cell in rows:
        names = re.findall(r"`(-[-\w]*)`", names_cell)
        assert names, names_cell
        unknown = [n for n in names if n not in actions]
        assert not unknown, f"the README's table of {module} names options the parser does not have: {unknown}"
        defaults = [d.strip().strip("`") for d in default_cell.split(",")] if default_cell.strip() else []
        if not defaults or len(defaults) != len(names):
            continue
        for name, stated in zip(names, defaults):
            actual = _effective_default(actions[name])
            if stated == "off":
                assert actual is False, (name, actual)
            else:
                try:
                    assert float(stated) == float(actual), (name, stated, actual)
                except (TypeError, ValueError):
                    assert stated == str(actual).rstrip("/"), (name, stated, actual)
    missing = [s for a in parser._actions for s in a.option_strings[-1:]
               if s != "--help" and not any(f"`{o}" in section for o in a.option_strings)]
    assert not missing, f"the README's section on {module} does not name {missing}"
