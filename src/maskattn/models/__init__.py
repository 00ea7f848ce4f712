"""Models: sentence classifier, NLI pair classifier, sequence tagger; context-fusion baselines of MTSA
Table 1 (Bi-LSTM, Bi-GRU, Multi-CNN, Hrchy-CNN) beside attention stacks built from layer recipes; classifiers
on pretrained Hugging Face encoders (``model.pretrained``, :mod:`.pretrained`)."""

from .classifier import SentenceClassifier, SentenceEncoder
from .config import MODEL_TYPES, ModelConfig
from .embedding import TokenEmbedding
from .factory import MODELS, build_model, list_models
from .fusion import BASELINES, BiRNN, HierarchicalCNN, MultiCNN, RecipeFusion, build_fusion, list_fusions
from .heads import MLP, POOLS, Pool
from .pair import PairClassifier
from .pretrained import PRETRAINED_PACKAGES, PretrainedClassifier, build_pretrained
from .seq2seq import DecoderState, Seq2Seq
from .tagger import SequenceTagger

__all__ = [
    "SentenceClassifier", "SentenceEncoder", "PairClassifier", "SequenceTagger", "ModelConfig", "MODEL_TYPES",
    "TokenEmbedding", "MODELS", "build_model", "list_models", "BASELINES", "BiRNN", "HierarchicalCNN", "MultiCNN",
    "RecipeFusion", "build_fusion", "list_fusions", "MLP", "POOLS", "Pool", "Seq2Seq", "DecoderState",
    "PretrainedClassifier", "build_pretrained", "PRETRAINED_PACKAGES",
]
