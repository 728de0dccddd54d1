"""Stage 5: the whole study (``python -m distattn.compare``) and its report."""

from distattn.compare.config import PROFILE_SIZES, PROFILES, CompareConfig, Sizes

__all__ = ["CompareConfig", "Sizes", "PROFILES", "PROFILE_SIZES", "run"]


def run(config: CompareConfig, cache: bool = True, progress: bool = True):
    """Run the study; returns the run directory (see :mod:`distattn.compare.run`)."""
    from distattn.compare.run import run as _run
    return _run(config, cache=cache, progress=progress)
