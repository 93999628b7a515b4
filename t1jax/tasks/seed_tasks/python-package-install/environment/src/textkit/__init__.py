"""textkit: tiny text statistics."""
from .core import count_text, load_stopwords

__all__ = ["count_text", "load_stopwords"]
