"""distattn: distributional-semantics attention analysis.

Stages, each importing only from the ones before it::

    corpus -> stats -> (projection, models) -> (train, analysis) -> compare

See README.md for the two commands and ../shared/design.md for the map.
"""

__version__ = "0.1.0"
