"""ner: fine-tune BERT-style encoders for named-entity recognition, through Accelerate or plain torch."""

__version__ = "0.1.0"
