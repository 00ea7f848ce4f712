"""Models: sentence classifier, NLI pair classifier, sequence tagger; context-fusion baselines of MTSA
Table 1 (Bi-LSTM, Bi-GRU, Multi-CNN, Hrchy-CNN) beside attention stacks built from layer recipes; classifiers
on pretrained Hugging Face encoders (``model.pretrained``, :mod:`.pretrained`). The modules take explicit
arguments; :mod:`.factory` is the one place where a model configuration becomes modules."""

from .classifier import EncoderClassifier, SentenceClassifier, SentenceEncoder
from .config import MODEL_TYPES, ModelConfig
from .embedding import TokenEmbedding
from .factory import MODELS, build_model, build_sentence_encoder, build_seq2seq, list_models
from .fusion import BASELINES, BiRNN, HierarchicalCNN, MultiCNN, RecipeFusion, list_fusions
from .heads import MLP, POOLS, Pool
from .pair import PairClassifier
from .pretrained import PRETRAINED_PACKAGES, PretrainedClassifier, build_pretrained
from .seq2seq import DecoderState, Seq2Seq
from .tagger import SequenceTagger

__all__ = [
    "SentenceClassifier", "SentenceEncoder", "EncoderClassifier", "PairClassifier", "SequenceTagger", "ModelConfig",
    "MODEL_TYPES", "TokenEmbedding", "MODELS", "build_model", "build_sentence_encoder", "build_seq2seq",
    "list_models", "BASELINES", "BiRNN", "HierarchicalCNN", "MultiCNN", "RecipeFusion", "list_fusions", "MLP", "POOLS", "Pool", "Seq2Seq", "DecoderState",
    "PretrainedClassifier", "build_pretrained", "PRETRAINED_PACKAGES",
]
