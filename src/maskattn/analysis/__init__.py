"""Analyses of attention: what a model's attention maps say, rather than what a mechanism computes.

* :func:`localness`, :func:`localness_per_sequence` (:mod:`maskattn.analysis.localness`): the attention mass
  within distance ``w`` of each query, MAN Eq. 13 / Table 5 (``maskattn viz localness`` prints it for
  checkpoints).
* :mod:`maskattn.analysis.reach`: how much of a pretrained cross-encoder's attention crosses between the two
  sentences of a pair and how far it reaches — ``python -m maskattn.analysis.reach --data PAIRS.jsonl``. It
  needs the ``hf`` extra (Hugging Face ``transformers``), so this package does not import it: import
  :mod:`maskattn.analysis.reach` itself.
"""

from .localness import localness, localness_per_sequence

__all__ = ["localness", "localness_per_sequence"]
