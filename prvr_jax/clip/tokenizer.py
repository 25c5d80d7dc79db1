"""CLIP's byte-level BPE tokenizer (OpenAI's SimpleTokenizer, as open_clip uses it).

A caption is cleaned (`ftfy.fix_text` when ftfy is installed, HTML entities unescaped twice,
runs of whitespace made one space), lowercased, split into words, numbers and punctuation runs,
and each piece is byte-encoded and merged by the BPE ranks of the merges file. A row of
`Tokenizer.__call__` is `<|startoftext|> tokens <|endoftext|>` then zeros. As in OpenAI's
tokenizer, the text `<|startoftext|>` or `<|endoftext|>` inside a caption becomes that special
token (open_clip 3.x tokenises it as plain text; otherwise the two agree).

The merges file (`bpe_simple_vocab_16e6.txt.gz`, 48,894 merges after a header line, 49,408
tokens) is not shipped with prvr_jax; `default_vocab_path()` finds the copy that open_clip (or
OpenAI's `clip` package) installs, or the file that `PRVR_CLIP_VOCAB` names.

Without ftfy (not a dependency of prvr_jax) text is only NFC-normalised: ftfy's other repairs
(mojibake, curly quotes to straight, ligatures, full-width characters) are then not made, so
such captions may tokenise differently from CLIP's own tokenizer; plain text does not.
Without the `regex` package the split uses the same pattern written for `re` (`re_pattern`),
with the Unicode categories of Python's `unicodedata`.
"""

from collections.abc import Sequence
import functools
import gzip
import html
import importlib.util
import os
import pathlib
import re
import sys
import unicodedata

import numpy as np

try:
  import regex
except ImportError:  # pragma: no cover - depends on the environment
  regex = None
try:
  import ftfy
except ImportError:  # pragma: no cover - depends on the environment
  ftfy = None

VOCAB_FILE = 'bpe_simple_vocab_16e6.txt.gz'
VOCAB_ENV = 'PRVR_CLIP_VOCAB'
SOT = '<|startoftext|>'
EOT = '<|endoftext|>'
CONTEXT_LENGTH = 77
# OpenAI keeps the first 49152 - 256 - 2 merges: 256 byte tokens, 256 byte tokens ending a
# word, the merges and the two special tokens make its 49,408-token vocabulary.
MAX_MERGES = 49152 - 256 - 2

_SPECIAL = r'<\|startoftext\|>|<\|endoftext\|>'
_CONTRACTIONS = r"'s|'t|'re|'ve|'m|'ll|'d"
# Words (letters), single numeric characters, and runs of anything else but whitespace.
REGEX_PATTERN = rf'{_SPECIAL}|{_CONTRACTIONS}|[\p{{L}}]+|[\p{{N}}]|[^\s\p{{L}}\p{{N}}]+'


@functools.cache
def re_pattern() -> str:
  """`REGEX_PATTERN` for `re`, which has no Unicode categories: `\\w` is a letter, a number
  (category N) or '_', so letters are `[^\\W_<N>]` with <N> the category-N characters listed
  from `unicodedata` (built once: it scans every code point)."""
  numbers, start = [], None
  for code in range(sys.maxunicode + 2):
    is_number = code <= sys.maxunicode and unicodedata.category(chr(code))[0] == 'N'
    if is_number and start is None:
      start = code
    elif not is_number and start is not None:
      numbers.append(f'\\U{start:08x}-\\U{code - 1:08x}')
      start = None
  n = ''.join(numbers)
  return rf'{_SPECIAL}|{_CONTRACTIONS}|[^\W_{n}]+|[{n}]|(?:[^\s\w]|_)+'


def default_vocab_path() -> str:
  """The BPE merges file: `$PRVR_CLIP_VOCAB` if set, else the copy installed with open_clip
  (or OpenAI's `clip` package), found without importing them; FileNotFoundError otherwise."""
  if os.environ.get(VOCAB_ENV):
    return os.environ[VOCAB_ENV]
  for package in ('open_clip', 'clip'):
    try:
      spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
      continue
    for folder in (spec.submodule_search_locations or []) if spec else []:
      path = pathlib.Path(folder) / VOCAB_FILE
      if path.is_file():
        return str(path)
  raise FileNotFoundError(
      f'CLIP\'s BPE vocabulary {VOCAB_FILE} was not found: install open_clip_torch (it ships '
      f'the file) or set {VOCAB_ENV} to the path of a copy')


def write_vocab(path: str | os.PathLike[str], merges: Sequence[str] = ()) -> str:
  """Writes a gzip-compressed BPE merges file of `merges` ('a b' each) and returns its path:
  with none, a byte-level vocabulary (512 tokens and the two specials, ids that fit the `tiny`
  CLIP). For tests and demos of random-initialised towers where CLIP's own file is absent."""
  path = os.fspath(path)
  with open(path, 'wb') as f:
    f.write(gzip.compress(('#version: 0.2\n' + ''.join(f'{m}\n' for m in merges)).encode()))
  return path


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
  """Each byte -> a printable character: printable Latin-1 bytes map to themselves, the others
  to the characters from U+0100 on (OpenAI's byte encoder). The dict's order -- the printable
  bytes first, then the others -- is the order of the first 256 token ids."""
  printable = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1),
               *range(ord('®'), ord('ÿ') + 1)]
  table = {b: chr(b) for b in printable}
  others = [b for b in range(256) if b not in table]
  table.update({b: chr(256 + i) for i, b in enumerate(others)})
  return table


def _pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
  return set(zip(word[:-1], word[1:]))


def clean(text: str) -> str:
  """ftfy (if installed; else NFC), HTML unescaped twice, whitespace collapsed, lowercased."""
  text = ftfy.fix_text(text) if ftfy is not None else unicodedata.normalize('NFC', text)
  text = html.unescape(html.unescape(text)).strip()
  return re.sub(r'\s+', ' ', text).strip().lower()


class Tokenizer:
  """CLIP's BPE tokenizer.

  Args:
    vocab_path: the merges file, gzip-compressed (`bpe_simple_vocab_16e6.txt.gz`) or plain
      text: a header line, then one merge 'a b' per line. None: `default_vocab_path()`.
  """

  def __init__(self, vocab_path: str | os.PathLike[str] | None = None):
    path = str(vocab_path) if vocab_path is not None else default_vocab_path()
    if not os.path.isfile(path):
      raise FileNotFoundError(f'CLIP BPE vocabulary not found: {path} (the merges file '
                              f'{VOCAB_FILE}; install open_clip_torch or set {VOCAB_ENV})')
    with open(path, 'rb') as f:
      data = f.read()
    if data[:2] == b'\x1f\x8b':
      data = gzip.decompress(data)
    lines = data.decode('utf-8').split('\n')[1:]
    merges = [tuple(line.split()) for line in lines if line.strip()][:MAX_MERGES]
    bad = [m for m in merges if len(m) != 2]
    if bad:
      raise ValueError(f'{path}: a merge line must hold two symbols, got {" ".join(bad[0])!r}')
    self.byte_encoder = bytes_to_unicode()
    symbols = list(self.byte_encoder.values())
    vocab = symbols + [s + '</w>' for s in symbols] + [a + b for a, b in merges] + [SOT, EOT]
    self.encoder = {token: i for i, token in enumerate(vocab)}
    self.decoder = {i: token for token, i in self.encoder.items()}
    self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
    self.bpe_ranks = {merge: i for i, merge in enumerate(merges)}
    self.sot_token = self.encoder[SOT]
    self.eot_token = self.encoder[EOT]
    self.vocab_size = len(vocab)
    self._pattern = (regex.compile(REGEX_PATTERN, regex.IGNORECASE) if regex is not None
                     else re.compile(re_pattern(), re.IGNORECASE))
    self._cache = {SOT: SOT, EOT: EOT}

  def bpe(self, token: str) -> str:
    """The BPE symbols of one byte-encoded word, space-separated, the last ending '</w>'."""
    if token in self._cache:
      return self._cache[token]
    word = (*token[:-1], token[-1] + '</w>')
    pairs = _pairs(word)
    while pairs:
      first, second = min(pairs, key=lambda p: self.bpe_ranks.get(p, float('inf')))
      if (first, second) not in self.bpe_ranks:
        break
      merged, i = [], 0
      while i < len(word):  # merge every occurrence, left to right
        if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
          merged.append(first + second)
          i += 2
        else:
          merged.append(word[i])
          i += 1
      word = tuple(merged)
      pairs = _pairs(word)
    result = ' '.join(word)
    self._cache[token] = result
    return result

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without the start and end tokens."""
    ids = []
    for piece in self._pattern.findall(clean(text)):
      encoded = ''.join(self.byte_encoder[b] for b in piece.encode('utf-8'))
      ids.extend(self.encoder[symbol] for symbol in self.bpe(encoded).split(' '))
    return ids

  def decode(self, ids: list[int]) -> str:
    """The text of token ids (lowercased and cleaned as encoded; '</w>' becomes a space)."""
    text = ''.join(self.decoder[int(i)] for i in ids)
    data = bytearray(self.byte_decoder[c] for c in text)
    return data.decode('utf-8', errors='replace').replace('</w>', ' ')

  def __call__(self, texts: str | list[str], context_length: int = CONTEXT_LENGTH,
               truncate: bool = False) -> np.ndarray:
    """`[N, context_length]` int32: SOT, the tokens of each text, EOT, zeros.

    A text with more than `context_length - 2` tokens raises ValueError, or with `truncate`
    keeps its first `context_length - 1` tokens (SOT included) and ends with EOT.
    """
    if isinstance(texts, str):
      texts = [texts]
    out = np.zeros((len(texts), context_length), np.int32)
    for row, text in enumerate(texts):
      tokens = [self.sot_token, *self.encode(text), self.eot_token]
      if len(tokens) > context_length:
        if not truncate:
          raise ValueError(f'caption {text[:60]!r} has {len(tokens)} tokens (start and end '
                           f'included), more than the context length {context_length}; '
                           'pass truncate=True to cut it')
        tokens = tokens[:context_length - 1] + [self.eot_token]
      out[row, :len(tokens)] = tokens
    return out
