"""The paper's worked examples (sections 2.5 and 3.2), pinned to the digit, and its errata.

Expected values are copied from the paper's printed matrices; where the prose disagrees with
them, the test follows the algebra and `corpora/paper/ERRATA.md` explains.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distattn.corpus.paper import PaperCorpus, load_paper_corpus
from distattn.projection import (ProjectionPredictor, association_profiles, context_matrix, global_evidence,
                                 next_token_distribution, row_normalize, selector, vocabulary_evidence)

WORDS = ["river", "bank", "loan", "money", "flooded", "shore", "rely"]


@pytest.fixture(scope="module")
def paper():
    return load_paper_corpus()


# --------------------------------------------------------------------------- the data

def test_loader_gives_words_matrix_and_examples(paper):
    assert isinstance(paper, PaperCorpus)
    assert paper.words == WORDS
    assert isinstance(paper.cooc, sp.csr_array) and paper.cooc.dtype == np.float64 and paper.cooc.shape == (7, 7)
    assert paper.examples == {"river_bank_flooded": ["river", "bank", "flooded"], "bank_loan": ["bank", "loan"]}
    # S as displayed stand-alone in section 2.5
    np.testing.assert_array_equal(paper.cooc.toarray(), [
        [0, 4, 0, 0, 5, 6, 0], [4, 0, 6, 5, 3, 5, 4], [0, 6, 0, 7, 0, 0, 2], [0, 5, 7, 0, 0, 0, 3],
        [5, 3, 0, 0, 0, 4, 0], [6, 5, 0, 0, 4, 0, 0], [0, 4, 2, 3, 0, 0, 0]])
    assert paper.encode("river_bank_flooded").tolist() == [0, 1, 4]
    assert [d.text for d in paper] == ["river bank flooded", "bank loan"]
    assert paper.vocabulary().itos == WORDS
    assert paper.fingerprint()["sha256"] == load_paper_corpus().fingerprint()["sha256"]


def test_loader_rejects_unknown_words(paper):
    with pytest.raises(KeyError, match="not in the paper vocabulary"):
        paper.encode(["river", "boat"])


def test_encode_names_the_examples_when_given_an_unknown_example_name(paper):
    # encode("bank") raised a bare KeyError('bank'), as if bank were not a paper word
    with pytest.raises(KeyError, match=r"'bank' is not an example .*'river_bank_flooded', 'bank_loan'.*\['bank'\]"):
        paper.encode("bank")
    assert paper.encode(["bank"]).tolist() == [1]


def test_registry_serves_the_paper_corpus():
    from distattn.corpus import get_corpus
    assert get_corpus("paper").words == WORDS


# --------------------------------------------------------------------------- section 2.5

def test_example1_selector_profiles_and_M(paper):
    ids = paper.encode("river_bank_flooded")
    np.testing.assert_array_equal(selector(ids, 7).toarray(),
                                  [[1, 0, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0]])
    np.testing.assert_array_equal(association_profiles(ids, paper.cooc).toarray(),
                                  [[0, 4, 0, 0, 5, 6, 0], [4, 0, 6, 5, 3, 5, 4], [5, 3, 0, 0, 0, 4, 0]])
    np.testing.assert_array_equal(context_matrix(ids, paper.cooc), [[0, 4, 5], [4, 0, 3], [5, 3, 0]])


def test_example1_norm_M_to_the_digit(paper):
    N = row_normalize(context_matrix(paper.encode("river_bank_flooded"), paper.cooc))
    np.testing.assert_array_equal(N.round(3), [[0, .444, .556], [.571, 0, .429], [.625, .375, 0]])
    # the paper's two-decimal print (0.625 printed as 0.62: round half to even)
    np.testing.assert_array_equal(N.round(2), [[0, .44, .56], [.57, 0, .43], [.62, .38, 0]])
    np.testing.assert_allclose(N, [[0, 4 / 9, 5 / 9], [4 / 7, 0, 3 / 7], [5 / 8, 3 / 8, 0]], rtol=0, atol=1e-15)


def test_example2_selector_profiles_M_and_norm(paper):
    ids = paper.encode("bank_loan")
    np.testing.assert_array_equal(selector(ids, 7).toarray(), [[0, 1, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(association_profiles(ids, paper.cooc).toarray(),
                                  [[4, 0, 6, 5, 3, 5, 4], [0, 6, 0, 7, 0, 0, 2]])
    M = context_matrix(ids, paper.cooc)
    np.testing.assert_array_equal(M, [[0, 6], [6, 0]])
    np.testing.assert_array_equal(row_normalize(M), [[0, 1], [1, 0]])


# --------------------------------------------------------------------------- section 3.2

def test_example1_evidence_global_and_prediction(paper):
    ids = paper.encode("river_bank_flooded")
    np.testing.assert_array_equal(vocabulary_evidence(ids, paper.cooc),
                                  [[41, 15, 24, 20, 12, 40, 16], [15, 25, 0, 0, 20, 36, 0],
                                   [12, 20, 18, 15, 34, 45, 12]])
    e = global_evidence(ids, paper.cooc)
    np.testing.assert_array_equal(e.round(2), [22.67, 20, 14, 11.67, 22, 40.33, 9.33])
    np.testing.assert_allclose(e, np.array([68, 60, 42, 35, 66, 121, 28]) / 3, rtol=1e-15)
    p = next_token_distribution(ids, paper.cooc)
    assert WORDS[int(np.argmax(p))] == "shore"
    # the paper's "≈ [0.00, 0.00, 0.00, 0.00, 0.00, 1.00, 0.00]"
    np.testing.assert_array_equal(p.round(2), [0, 0, 0, 0, 0, 1, 0])


def test_example2_evidence_global_and_prediction(paper):
    ids = paper.encode("bank_loan")
    np.testing.assert_array_equal(vocabulary_evidence(ids, paper.cooc),
                                  [[0, 36, 0, 42, 0, 0, 12], [24, 0, 36, 30, 18, 30, 24]])
    np.testing.assert_array_equal(global_evidence(ids, paper.cooc), [12, 18, 18, 36, 9, 15, 18])
    p = next_token_distribution(ids, paper.cooc)
    assert WORDS[int(np.argmax(p))] == "money"
    np.testing.assert_array_equal(p.round(2), [0, 0, 0, 1, 0, 0, 0])


def test_estimator_predicts_shore_and_money(paper):
    model = ProjectionPredictor().fit(paper.cooc)
    docs = [paper.encode("river_bank_flooded"), paper.encode("bank_loan")]
    assert [WORDS[i] for i in model.predict(docs)] == ["shore", "money"]
    np.testing.assert_allclose(model.transform(docs)[1], [12, 18, 18, 36, 9, 15, 18])
    np.testing.assert_allclose(model.predict_proba(docs).sum(axis=1), 1.0)


def test_softmax_of_raw_count_evidence_does_not_overflow(paper):
    # raw-count evidence reaches 1e4 on real corpora; scale the toy S up to get there
    ids = paper.encode("river_bank_flooded")
    p = next_token_distribution(ids, paper.cooc * 20.0)   # e_global up to 400 * 40.33 ≈ 1.6e4
    assert np.all(np.isfinite(p)) and p.sum() == pytest.approx(1.0)
    assert WORDS[int(np.argmax(p))] == "shore"


# --------------------------------------------------------------------------- errata (ERRATA.md)

def test_erratum_shore_scores_are_40_36_45_not_44_49_42(paper):
    E = vocabulary_evidence(paper.encode("river_bank_flooded"), paper.cooc)
    shore = E[:, WORDS.index("shore")]
    assert shore.tolist() == [40, 36, 45]
    assert shore.tolist() != [44, 49, 42]          # the prose of section 3.2
    assert shore.mean() == pytest.approx(40.33, abs=0.005)   # and e_global agrees with the algebra


def test_erratum_loan_scores_are_24_0_18_not_24_0_0(paper):
    E = vocabulary_evidence(paper.encode("river_bank_flooded"), paper.cooc)
    loan = E[:, WORDS.index("loan")]
    assert loan.tolist() == [24, 0, 18]
    assert loan.tolist() != [24, 0, 0]
    assert loan.mean() == pytest.approx(14.0)


def test_erratum_three_printings_of_S_differ_exactly_in_the_rely_column(paper):
    canonical = paper.printings["canonical"]
    np.testing.assert_array_equal(canonical, paper.cooc.toarray())
    np.testing.assert_array_equal(canonical, canonical.T)
    loan, money, rely = (WORDS.index(w) for w in ("loan", "money", "rely"))
    expected = {"example1_product": {(loan, rely), (money, rely)}, "example2_product": {(money, rely)}}
    for name, cells in expected.items():
        other = paper.printings[name]
        diff = {tuple(map(int, c)) for c in np.argwhere(other != canonical)}
        assert diff == cells, name
        assert all(other[c] == 0 for c in cells)
        assert not np.array_equal(other, other.T)
    assert set(paper.printings) == {"canonical", *expected}


def test_erratum_each_example_is_unchanged_under_its_own_printing(paper):
    for example in paper.examples:
        ids = paper.encode(example)
        for name in ("canonical", "example1_product", "example2_product"):
            same = vocabulary_evidence(ids, paper.printings[name])
            if example == "bank_loan" and name == "example1_product":
                # Example 1's printing has S[loan, rely] = 0, which would break the printed E₂
                assert same[0, WORDS.index("rely")] == 0
                continue
            np.testing.assert_array_equal(same, vocabulary_evidence(ids, paper.cooc), err_msg=f"{name} / {example}")


def test_erratum_loan_rely_entry_used_by_E2_is_2(paper):
    # E₂'s first row ends in 12 = M[bank, loan] * S[loan, rely] = 6 * 2
    E2 = vocabulary_evidence(paper.encode("bank_loan"), paper.cooc)
    assert E2[0, WORDS.index("rely")] == 12 == 6 * paper.cooc[[2], [6]][0]



def test_erratum_softmax_shortfalls_match_errata_md(paper):
    # ERRATA.md §4 gives 1 - p(shore) and 1 - p(money) at τ = 1 to two significant digits;
    # it said 4.7e-8 for money, where the shortfall is 4.65e-8 (3·e⁻¹⁸ + e⁻²¹ + …)
    import re
    text = (paper.directory / "ERRATA.md").read_text(encoding="utf-8")
    printed = [float(x) for x in re.findall(r"`1 - ([0-9.]+e-[0-9]+)`", text)]
    shortfall = []
    for example, word in (("river_bank_flooded", "shore"), ("bank_loan", "money")):
        p = next_token_distribution(paper.encode(example), paper.cooc)
        shortfall.append(float(np.delete(p, WORDS.index(word)).sum()))
    assert printed == [float(f"{x:.1e}") for x in shortfall] == [3.4e-8, 4.6e-8]


# --------------------------------------------------------------------------- Proposition 1

_sizes = st.tuples(st.integers(1, 9), st.integers(1, 7))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_proposition1_QSQT_is_the_unique_inner_product_preserving_operator(data):
    n, R = data.draw(_sizes)
    S = data.draw(hnp.arrays(np.float64, (n, n), elements=st.floats(-50, 50, allow_subnormal=False)))
    ids = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=R, max_size=R)))
    M = context_matrix(ids, S)
    Q = selector(ids, n).toarray()
    # (ii) u^T T v = (Q^T u)^T S (Q^T v) for all u, v: check on random u, v ...
    u = data.draw(hnp.arrays(np.float64, R, elements=st.floats(-3, 3)))
    v = data.draw(hnp.arrays(np.float64, R, elements=st.floats(-3, 3)))
    assert u @ M @ v == pytest.approx((Q.T @ u) @ S @ (Q.T @ v), rel=1e-9, abs=1e-7)
    # ... and uniqueness: the bilinear form on the basis vectors pins every entry of T
    for r in range(R):
        for s in range(R):
            e_r, e_s = np.eye(R)[r], np.eye(R)[s]
            assert M[r, s] == (Q.T @ e_r) @ S @ (Q.T @ e_s)
    # (i) T depends only on the tokens selected: the same ids over any superset vocabulary agree
    big = np.zeros((n + 2, n + 2))
    big[:n, :n] = S
    big[n:, :] = 99.0
    big[:, n:] = 99.0
    np.testing.assert_array_equal(context_matrix(ids, big), M)


def test_analysis_script_prints_the_paper_matrices(capsys):
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "analyses" / "paper_examples.py"
    spec = importlib.util.spec_from_file_location("paper_examples_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main([])
    out = capsys.readouterr().out
    assert "prediction: 'shore'" in out and "prediction: 'money'" in out
    assert "   0.62    0.38    0.00" in out             # Norm(M) of "river bank flooded", as printed
    assert "   22.67   20.00   14.00   11.67   22.00   40.33    9.33" in out
