"""Real data that Debian packages (or this package) ship, read without downloads, each
file checked against its packaged sha256; and synthetic in-context regression.

- austen_splits / load_novels: Jane Austen's novels (r-cran-janeaustenr), split by novel
- load_mobydick: Melville's Moby Dick (r-cran-tokenizers), held-out text
- load_fashion_mnist: Fashion-MNIST (dataset-fashion-mnist), standard split
- gcide_splits / load_gcide: GCIDE, Webster's 1913 dictionary (dict-gcide), 98/1/1 split
- load_ett / forecast_windows: ETTh1 and ETTh2 (in the package), 12/4/4-month split
- sample_linear_regression / Curriculum: y = w . x in context, dimension curriculum;
  prefix_least_squares: the best-possible predictions (minimum-norm least squares)
- sample_sphere_retrieval / nearest_neighbour_accuracy: the low-rank bottleneck's probe
- ByteTokenizer, BpeTokenizer, make_tokenizer
DataError (a ValueError) reports a missing, corrupt or truncated file.
"""

from .._optional import require

require("subquad.data", "data", ["torch"])

from .austen import austen_splits, load_novels
from .errors import DataError
from .ett import forecast_windows, load_ett
from .fashion_mnist import load_fashion_mnist, normalise
from .gcide import gcide_splits, load_gcide
from .mobydick import load_mobydick
from .regression import Curriculum, prefix_least_squares, sample_linear_regression
from .retrieval import RetrievalBatch, nearest_neighbour_accuracy, sample_sphere_retrieval
from .text_tokenizers import BpeTokenizer, ByteTokenizer, make_tokenizer

__all__ = ["austen_splits", "load_novels", "DataError", "forecast_windows", "load_ett",
           "load_fashion_mnist", "gcide_splits", "load_gcide", "load_mobydick", "normalise",
           "Curriculum", "prefix_least_squares",
           "sample_linear_regression", "RetrievalBatch", "nearest_neighbour_accuracy",
           "sample_sphere_retrieval",
           "BpeTokenizer", "ByteTokenizer", "make_tokenizer"]
