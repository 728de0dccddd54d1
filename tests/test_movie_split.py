"""``distattn.corpus.movie_disjoint_split``: held-out reviews about movies the kept ones never cover."""

from __future__ import annotations

import numpy as np
import pytest

from distattn.corpus import movie_disjoint_split


def _movies(n=5_000, n_movies=300, seed=1):
    rng = np.random.default_rng(seed)
    return np.array([f"tt{m:07d}" for m in rng.integers(0, n_movies, n)])


def test_whole_movies_are_held_out_until_enough_reviews():
    movies = _movies()
    kept, held = movie_disjoint_split(movies, 500, seed=4)
    assert not set(movies[kept]) & set(movies[held])
    assert np.array_equal(np.sort(np.concatenate([kept, held])), np.arange(len(movies)))
    assert np.all(np.diff(kept) > 0) and np.all(np.diff(held) > 0)
    # the documented order: the shortest prefix of default_rng(seed).permutation over the sorted ids
    # whose movies hold at least 500 reviews, no movie more
    names, counts = np.unique(movies, return_counts=True)
    order = np.random.default_rng(4).permutation(len(names))
    n_movies = int(np.argmax(np.cumsum(counts[order]) >= 500)) + 1
    assert set(movies[held]) == set(names[order[:n_movies]])
    assert len(held) >= 500 and len(held) - counts[order[n_movies - 1]] < 500


def test_the_split_depends_on_the_seed_and_the_ids_not_on_the_reviews_order():
    movies = _movies()
    kept, held = movie_disjoint_split(movies, 500, seed=4)
    again = movie_disjoint_split(movies, 500, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip((kept, held), again))
    assert not np.array_equal(held, movie_disjoint_split(movies, 500, seed=5)[1])
    perm = np.random.default_rng(0).permutation(len(movies))
    _, held_perm = movie_disjoint_split(movies[perm], 500, seed=4)
    assert set(movies[perm][held_perm]) == set(movies[held])
    # integer ids work the same as strings
    codes = np.unique(movies, return_inverse=True)[1].astype(np.int32)
    assert np.array_equal(movie_disjoint_split(codes, 500, seed=4)[1], held)


@pytest.mark.parametrize("n_held_out, message", [
    (0, r"n_held_out=0: expected a positive integer"),
    (2.5, r"n_held_out=2.5: expected a positive integer"),
    (True, r"n_held_out=True: expected a positive integer"),
    (9, r"n_held_out=9: .*leaves none to keep \(9 reviews of 5 movies\); allowed: at most \d with seed 0"),
])
def test_bad_sizes_name_the_value_and_what_is_allowed(n_held_out, message):
    with pytest.raises(ValueError, match=message):
        movie_disjoint_split(np.array(list("aabbbcdde")), n_held_out)


def test_one_movie_cannot_be_split_and_ids_must_be_one_per_review():
    with pytest.raises(ValueError, match="one movie cannot be split"):
        movie_disjoint_split(np.array(["a", "a", "a"]), 1)
    with pytest.raises(ValueError, match=r"1-d\); got shape \(2, 2\)"):
        movie_disjoint_split(np.array([["a", "b"], ["c", "d"]]), 1)
