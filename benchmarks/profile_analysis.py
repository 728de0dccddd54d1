"""Wall time of each stage of ``python -m distattn.compare`` that runs on the CPU, at a
profile's full sizes, without training: data, statistics, and every analysis section with
*untrained* models of the profile's shapes (the analysis does the same work whatever the
weights). The model training and the projection table run on the GPU in the ``full``
profile and are measured by ``benchmarks/gpu_compare.sh``.

    python benchmarks/profile_analysis.py                   # the full profile's sizes
    python benchmarks/profile_analysis.py --profile quick
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from distattn.compare.config import PROFILE_SIZES, CompareConfig


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="full", choices=sorted(PROFILE_SIZES))
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)

    import torch

    from distattn.compare.run import analyse
    from distattn.compare.stages import Trained, load_data, stage_statistics
    from distattn.models import (AttentionOnlyConfig, LMConfig, ProjectionMatchedLM, TransformerClassifier,
                                 TransformerLM, seed_classifier_config)
    sizes = PROFILE_SIZES[args.profile]
    cfg = CompareConfig(corpus="imdb", data_dir=args.data_dir, profile=args.profile)
    print(f"profile {args.profile}; torch threads {torch.get_num_threads()}")
    t = time.perf_counter()
    data = load_data(cfg, sizes, progress=False)
    print(f"data        {time.perf_counter() - t:7.1f}s  ({data.describe['statistics_docs']:,} statistics docs, "
          f"vocabulary {len(data.vocab):,})")
    t = time.perf_counter()
    stats = stage_statistics(data, sizes, cache=True)
    print(f"statistics  {time.perf_counter() - t:7.1f}s  (cached when run before: {stats.seconds:.1f}s to build)")
    V = len(data.vocab)
    torch.manual_seed(0)
    models = {"classifier": TransformerClassifier(seed_classifier_config(vocab_size=V, **sizes.clf_model)),
              "attention_only_lm": ProjectionMatchedLM(AttentionOnlyConfig(vocab_size=V, **sizes.attn_model)),
              "transformer_lm": TransformerLM(LMConfig(vocab_size=V, **sizes.lm_model))}
    models = {n: Trained(n, m, {}, Path("untrained.pt")) for n, m in models.items()}
    with tempfile.TemporaryDirectory() as tmp:
        for sub in ("figures", "graphs"):
            (Path(tmp) / sub).mkdir()
        t = time.perf_counter()
        out = analyse(Path(tmp), data, stats, models, sizes, torch.device("cpu"))
        total = time.perf_counter() - t
    for name, sec in out["section_seconds"].items():
        print(f"  analysis {name:<26s} {sec:7.1f}s")
    print(f"analysis    {total:7.1f}s")


if __name__ == "__main__":
    main()
