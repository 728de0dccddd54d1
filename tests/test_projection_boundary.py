"""What a researcher passes in their own script: each bad argument is named in the error."""

import numpy as np
import pytest

from distattn.projection import (attention_weights, combine_heads, cross_vocabulary_evidence, directional_factors,
                                 global_evidence, multihead_evidence, next_token_distribution, svd_heads,
                                 vocabulary_evidence)

S = np.array([[0., 2., 1., 0.], [2., 0., 3., 1.], [1., 3., 0., 2.], [0., 1., 2., 1.]])


@pytest.mark.parametrize("call", [
    lambda: attention_weights(S[:3, :3], "softmax", attention_temperature=0),
    lambda: vocabulary_evidence([0, 1], S, normalization="softmax", attention_temperature=0),
    lambda: global_evidence([0, 1], S, normalization="softmax", attention_temperature=0),
    lambda: next_token_distribution([0, 1], S, temperature=2.0, normalization="softmax", attention_temperature=0),
    lambda: cross_vocabulary_evidence([0], [1, 2], S, normalization="softmax", attention_temperature=0),
    lambda: combine_heads(np.ones((2, 3, 3)), "mean_softmax", attention_temperature=0),
    lambda: multihead_evidence([0, 1], svd_heads(S, 1, 1), normalization="softmax", attention_temperature=0),
])
def test_a_bad_attention_temperature_is_named_as_such(call):
    """It was reported as 'temperature must be ... got 0', although the output temperature was
    valid (2.0 above) and the bad value was attention_temperature."""
    with pytest.raises(ValueError, match=r"^attention_temperature must be a finite real number > 0; got 0$"):
        call()


@pytest.mark.parametrize("algorithm", ["arpack", "randomized"])
def test_a_rank_too_large_for_the_vocabulary_names_the_callers_arguments(algorithm):
    """truncated_svd's 'dim must be an integer with 1 <= dim < min(X.shape) = 4 ..., got 4' came
    through, naming an argument the caller never passed."""
    with pytest.raises(ValueError, match=r"^n_heads \* head_rank = 2 \* 2 = 4 must be < vocab_size = 4"):
        svd_heads(S, 2, 2, algorithm=algorithm)
    with pytest.raises(ValueError, match=r"^rank must be < vocab_size = 4 for a truncated SVD; got 4"):
        directional_factors(S, 4, algorithm=algorithm)
    assert len(svd_heads(S, 3, 1, algorithm=algorithm)) == 3 and directional_factors(S, 3)[0].shape == (4, 3)
