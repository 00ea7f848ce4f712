"""maskattn mechanisms inside pretrained Hugging Face ``transformers`` encoders (``pip install maskattn[hf]``).

* :func:`register` — CSAN 1D / 2D and SMAN as ``transformers`` attention implementations
  (``attn_implementation="maskattn_csan2d"``), with the mask function that passes the padding mask.
* :func:`convert` — DMAN, MTSA, CSAN or SMAN in chosen layers of a loaded BERT-family encoder, reusing
  the pretrained weights; DMAN and MTSA start out computing exactly the original model.
* :func:`load_encoder` — a local model folder (offline), with saved conversions restored.

Guide: ``docs/hf.md``. ``import maskattn`` never imports ``transformers``; this subpackage needs it.
"""

try:
    import transformers  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("maskattn.hf needs Hugging Face transformers: pip install 'maskattn[hf]'") from exc

from .base import ConvertedSelfAttention
from .convert import CONVERSIONS_KEY, MECHANISMS, SUPPORTED_MODEL_TYPES, ConversionWarning, convert
from .interface import REGISTRABLE, SDPA, register
from .loading import load_encoder

__all__ = ["register", "convert", "load_encoder", "ConvertedSelfAttention", "ConversionWarning", "MECHANISMS",
           "SUPPORTED_MODEL_TYPES", "REGISTRABLE", "SDPA", "CONVERSIONS_KEY"]
