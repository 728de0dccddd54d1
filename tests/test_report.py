"""What report.html and the terminal table show: the numbers the run computed, with the digits
they have, and user text escaped."""
import json
import re

from distattn.compare.__main__ import main


def _paper_report(tmp_path, capsys):
    assert main(["--corpus", "paper", "--out", str(tmp_path), "-q"]) == 0
    capsys.readouterr()
    run_dir = next(tmp_path.iterdir())
    return (run_dir / "report.html").read_text(), json.loads((run_dir / "metrics.json").read_text())


def _rows(html: str, header: str) -> list[list[str]]:
    """The body cells of the first table whose header row starts with ``header``."""
    table = html[html.index(f"<table><tr><th>{header}</th>"):]
    table = table[:table.index("</table>")]
    return [re.findall(r"<td>(.*?)</td>", r) for r in table.split("</tr>")[1:] if "<td>" in r]


def test_paper_examples_show_the_papers_digits_not_padded_rounded_ones(tmp_path, capsys):
    """Norm(M), rounded to 3 places in metrics.json, was printed with 4 (0.4440 for 4/9 = 0.4444),
    and e_global, rounded to 2, as 22.6700 for 68/3: digits that are neither the value nor the
    paper's (003 §2.5: 0.44 0.56 / 0.57 0.43 / 0.62 0.38; §3.2: 22.7 20.0 14.0 11.7 22.0 40.3 9.3)."""
    html, _ = _paper_report(tmp_path, capsys)
    river = html[html.index("“river bank flooded”"):html.index("“bank loan”")]
    assert _rows(river, "") == [["river", "0.00", "0.44", "0.56"], ["bank", "0.57", "0.00", "0.43"],
                                ["flooded", "0.62", "0.38", "0.00"]]
    assert _rows(river, "e_global") == [["", "22.7", "20.0", "14.0", "11.7", "22.0", "40.3", "9.3"]]
    loan = html[html.index("“bank loan”"):]
    assert _rows(loan, "") == [["bank", "0.00", "1.00"], ["loan", "1.00", "0.00"]]
    assert _rows(loan, "e_global") == [["", "12.0", "18.0", "18.0", "36.0", "9.0", "15.0", "18.0"]]


def test_a_cell_that_starts_with_a_tag_is_escaped_like_any_other():
    """_table passed any string cell beginning with "<" through as HTML: a sense community whose
    largest-share word was "<img ...>" was written into the page unescaped (the same word later in
    the list was escaped)."""
    from distattn.compare.report import _senses
    html = _senses({"word": "bank", "communities": [["<img src=x onerror=alert(1)>", "river"], ["money"]],
                    "share": [0.75, 0.25], "modularity": 0.3})
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;, river" in html


def _env(corpus: str) -> dict:
    return {"config": {"corpus": corpus}, "profile": "quick", "device": "cpu", "seed": 0,
            "versions": {"distattn": "0"}, "git_hash": None, "command": "python -m distattn.compare"}


def _row(model, family, perplexity, top1=0.1, top10=0.5, temperature=None):
    return {"key": model, "model": model, "family": family, "temperature": temperature, "perplexity": perplexity,
            "top1": top1, "top10": top10, "positions": 390, "seconds": 1.0}


def test_next_token_note_names_the_corpus_documents(tmp_path):
    """The next-token section said τ was fitted on "held-out validation reviews" for any corpus;
    a text corpus has documents (as every other sentence of the report and run.py says)."""
    from distattn.compare.report import write_report
    nt = [_row("unigram (add-1)", "ngram", 31.3), _row("PPMI + Norm", "projection", 28.3, temperature=0.21)]
    for corpus, kind in (("text", "documents"), ("imdb", "reviews")):
        (tmp_path / corpus).mkdir()
        metrics = {"timings_s": {"total": 1.0}, "data": {"corpus": corpus, "documents": 90}, "next_token": nt}
        html = write_report(tmp_path / corpus, _env(corpus), metrics).read_text()
        assert f"held-out validation {kind} for the projection rows" in html


def test_bank_senses_are_shown_without_models(tmp_path):
    """The PPMI sense communities of "bank" need no model and are computed under --no-models, but
    the report wrote them only inside the graphs-and-kernels section, which needs a trained LM:
    a --no-models run kept them in metrics.json and left them out of report.html."""
    from distattn.compare.report import write_report
    senses = {"word": "bank", "communities": [["river", "shore"], ["money", "loan"]], "share": [0.4, 0.6],
              "modularity": 0.25}
    metrics = {"timings_s": {"total": 1.0}, "analysis": {"bank_senses": senses}}
    html = write_report(tmp_path, _env("imdb"), metrics).read_text()
    assert "Senses of <b>bank</b>" in html and "money, loan" in html and "river, shore" in html


def test_non_finite_numbers_inside_arrays_become_null_in_metrics_json():
    """jsonable (once compare.run._jsonable) turned NaN and inf into null except inside numpy arrays (tolist() was returned
    as is): a CKA matrix with a constant kernel wrote a bare NaN into metrics.json, which is not
    JSON (JSON.parse and other strict readers refuse the file)."""
    import numpy as np

    from distattn.atomic import jsonable
    out = jsonable({"cka": {"matrix": np.array([[1.0, np.nan], [np.inf, 1.0]])}, "ids": np.arange(2)})
    assert json.dumps(out, allow_nan=False) == '{"cka": {"matrix": [[1.0, null], [null, 1.0]]}, "ids": [0, 1]}'


def test_a_non_finite_perplexity_is_a_dash_and_never_the_best_row(tmp_path):
    """metrics.json holds a non-finite perplexity as null, and the terminal table formatted it with
    :11.2f (TypeError after the report was written); in the report a NaN first row won the
    "best" highlight, since every comparison with NaN is False."""
    from distattn.compare.report import terminal_table, write_report
    nt = [_row("PPMI + Norm", "projection", float("nan"), temperature=0.21), _row("unigram (add-1)", "ngram", 31.3),
          _row("KN-3", "ngram", 25.0)]
    metrics = {"timings_s": {"total": 1.0}, "data": {"corpus": "text", "documents": 90}, "next_token": nt}
    html = write_report(tmp_path, _env("text"), metrics).read_text()
    assert re.search(r'<tr class="best"><td>KN-3</td>', html)
    stored = json.loads(json.dumps([dict(r, perplexity=None) if r["perplexity"] != r["perplexity"] else r
                                    for r in nt]))
    lines = terminal_table({"timings_s": {"total": 1.0}, "next_token": stored}).splitlines()
    assert lines[1].split()[-3:] == ["–", f"{nt[0]['top1']:.4f}", f"{nt[0]['top10']:.4f}"]
    assert lines[3].split()[-3] == "25.00"


def test_headline_skips_non_finite_numbers_and_dashes_missing_ones(tmp_path):
    """headline() took a family's first row as its best even when its perplexity was NaN (every
    comparison with NaN is False), printing "PPMI + Norm nan"; an inf one printed "inf"; a model whose
    heads all had an undefined Spearman ρ (null) printed "+nan"; and a null Jensen–Shannon mean
    (metrics.json's NaN) raised TypeError in write_report, after every stage had run."""
    from distattn.compare.report import headline, write_report
    nt = [_row("PPMI + Norm", "projection", float("nan"), temperature=0.2),
          _row("PPMI + softmax", "projection", float("inf"), temperature=0.2),
          _row("asymmetric", "projection", 28.3, temperature=0.2), _row("KN-3", "ngram", 25.0)]
    corr = [{"model": "lm", "head": h, "statistic": "PPMI", "rho_all": None, "rho_positive": None,
             "n_pairs_all": 12} for h in range(2)]
    summary = {"model": "lm", "mean_over_heads": {"Norm(QSQᵀ)": {"js_mean": None, "spearman_mean": None, "top1": None},
                                                  "uniform": {"js_mean": 0.25, "spearman_mean": 0.1, "top1": 0.2}}}
    metrics = {"timings_s": {"total": 1.0}, "next_token": nt,
               "analysis": {"attention_pmi_correlation": corr, "agreement_summary": summary}}
    rows = {q.split(":")[0].split(",")[0]: (a, b) for q, a, b, _ in headline(metrics)}
    assert rows["Next-token perplexity"] == ("asymmetric 28.3", "KN-3 25.0")
    assert rows["Spearman(QK scores"] == ("–", "12 word pairs")
    assert rows["Jensen–Shannon divergence to lm's heads"] == ("–", "uniform 0.250, previous-token –")
    html = write_report(tmp_path, _env("text"), metrics).read_text()
    one_table = html[html.index("The question in one table"):html.index("<h2>Next-token")]
    assert "asymmetric 28.3" in one_table and not re.search(r"\b(nan|inf)\b", one_table)



def test_missing_numbers_in_the_report_text_are_dashes(tmp_path):
    """A null p(positive), sense modularity or spectral gap (metrics.json's NaN) raised TypeError
    in write_report (f"{None:.2f}"), failing the whole run after every stage had run."""
    from distattn.compare.report import write_report
    analysis = {"heatmaps": [{"example": "held-out review 1", "expected": "positive", "figure": "heatmap_1.png",
                              "tokens": 9, "p_positive": None}],
                "bank_senses": {"word": "bank", "communities": [["river"], ["money"]], "share": [0.5, 0.5],
                                "modularity": None},
                "graph": {"model": "lm", "tokens": ["a"], "spectral_gap": None, "pagerank_top": ["a"],
                          "rollout_last_row_top": ["a"], "flow_to_last_top": ["a"]}}
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "heatmap_1.png").write_bytes(b"\x89PNG")
    html = write_report(tmp_path, _env("imdb"), {"timings_s": {"total": 1.0}, "analysis": analysis}).read_text()
    assert "p(positive) = –" in html and "(modularity –)" in html and "Spectral gap –;" in html


def test_an_infinite_number_in_a_table_is_a_dash(tmp_path):
    """_fmt dashed NaN but wrote inf as "inf" (and -inf as "-inf"): a next-token row whose model gave a
    test target probability 0 showed perplexity "inf", where the terminal table and metrics.json
    (null) show a missing value."""
    from distattn.compare.report import write_report
    nt = [_row("raw counts, A = M (paper)", "projection", float("inf"), temperature=0.5),
          _row("KN-3", "ngram", 25.0, top1=float("-inf"))]
    html = write_report(tmp_path, _env("text"), {"timings_s": {"total": 1.0}, "next_token": nt}).read_text()
    assert _rows(html, "model") == [["raw counts, A = M (paper)", "projection", "0.5000", "–", "0.1000", "0.5000",
                                     "390", "1.0000"],
                                    ["KN-3", "ngram", "–", "25.0000", "–", "0.5000", "390", "1.0000"]]


def test_terminal_table_with_a_missing_classifier_accuracy():
    """stage_models stores the seed classifier's test accuracy as None when its history is empty
    (metrics.json: null, and a NaN accuracy becomes null too); the terminal table formatted it
    with :.4f, a TypeError after report.html was written (the best classifier's line had the check)."""
    from distattn.compare.report import terminal_table
    lines = terminal_table({"timings_s": {"total": 1.0},
                            "classifier": {"test_accuracy": None, "config": "seed architecture"}}).splitlines()
    assert lines[0] == "classifier test accuracy: – (seed paper: 0.8618)"


def test_a_skipped_classifier_is_named_with_its_reason(tmp_path):
    """load_data keeps why a text corpus trains no classifier in data.classifier_skipped "for the
    report", but the report wrote only the integer entries of data: the classifier section was
    simply missing, with no word of why."""
    from distattn.compare.report import write_report
    data = {"corpus": "text", "documents": 90, "classifier_skipped": "the 80 labelled training documents all have "
                                                                     "label 1 <&>"}
    html = write_report(tmp_path, _env("text"), {"timings_s": {"total": 1.0}, "data": data}).read_text()
    assert ("<h2>Sentiment classifier</h2><p class='muted'>Not trained: the 80 labelled training documents all "
            "have label 1 &lt;&amp;&gt;.</p>") in html


def test_heatmaps_without_learned_heads_are_not_titled_against_them(tmp_path):
    """A --no-models run draws the projection's pattern alone, and the report's section was headed
    "projection vs learned heads" all the same; with learned heads the heading is unchanged."""
    from distattn.compare.report import write_report
    heat = {"example": "held-out review 1", "expected": "", "figure": "heatmap_1.png", "tokens": 12}
    for learned, heading in ((0, "Attention of the projection (no model trained)"),
                             (8, "Attention side by side: projection vs learned heads")):
        (tmp_path / str(learned)).mkdir()
        metrics = {"timings_s": {"total": 1.0}, "analysis": {"heatmaps": [dict(heat, learned_heads=learned)]}}
        html = write_report(tmp_path / str(learned), _env("imdb"), metrics).read_text()
        assert heading in html and ("learned heads" in html) == bool(learned)


def test_each_pmi_correlation_is_shown_beside_its_own_pair_count(tmp_path):
    """The per-head table had one "pairs" column, the all-pairs count, after both ρ's: ρ (PPMI > 0),
    taken over far fewer pairs, read as if it had as many."""
    from distattn.compare.report import write_report
    corr = [{"model": "lm", "head": 0, "statistic": "PPMI", "rho_all": 0.125, "n_pairs_all": 4950,
             "rho_positive": 0.25, "n_pairs_positive": 321}]
    metrics = {"timings_s": {"total": 1.0}, "analysis": {"attention_pmi_correlation": corr}}
    html = write_report(tmp_path, _env("text"), metrics).read_text()
    table = html[html.index("Attention–PMI correlation per head"):]
    table = table[:table.index("</table>")]
    cells = re.findall(r"<t[dh]>(.*?)</t[dh]>", table)
    assert cells[cells.index("ρ (PPMI &gt; 0)") + 1] == "pairs (PPMI &gt; 0)"
    row = cells[len(cells) // 2:]
    assert row[3:] == ["0.1250", "4950", "0.2500", "321"]


def test_the_git_hash_of_a_checkout_with_uncommitted_changes_is_marked(tmp_path):
    """The report's header named the git hash as the code of the run even when the package had
    uncommitted changes (config.json's git_dirty)."""
    from distattn.compare.report import write_report
    metrics = {"timings_s": {"total": 1.0}}
    for dirty in (False, True):
        (tmp_path / str(dirty)).mkdir()
        env = {**_env("imdb"), "git_hash": "0123456789abcdef", "git_dirty": dirty}
        html = write_report(tmp_path / str(dirty), env, metrics).read_text()
        assert ("git 0123456789 with uncommitted changes ·" in html) is dirty and "git 0123456789" in html
