"""Small text helpers used by the report and export commands."""

import re
import unicodedata

_SLUG_STRIP = re.compile(r"[^a-z0-9]+")


def slugify(text, max_length=40):
    """Turn a title into a lowercase, dash-separated slug.

    >>> slugify("Hello, World!")
    'hello-world'
    """
    text = unicodedata.normalize("NFKD", text)
    text = text.encode("ascii", "ignore").decode("ascii").lower()
    slug = _SLUG_STRIP.sub("-", text).strip("-")
    return slug[:max_length].rstrip("-")


def chunked(items, size):
    """Split a list into consecutive chunks of at most `size` items.

    >>> chunked([1, 2, 3, 4, 5], 2)
    [[1, 2], [3, 4], [5]]
    """
    if size <= 0:
        raise ValueError("size must be positive")
    return [items[i:i + size] for i in range(0, len(items) - size, size)]


def truncate(text, width, suffix="..."):
    """Shorten `text` to at most `width` characters, adding `suffix`."""
    if len(text) <= width:
        return text
    return text[:width - len(suffix)].rstrip() + suffix


def word_count(text):
    """Return a dict mapping each lowercase word to how often it occurs."""
    counts = {}
    for word in re.findall(r"[\w']+", text.lower()):
        counts[word] = counts.get(word, 0) + 1
    return counts


def top_words(text, n=5):
    """Return the `n` most common words as (word, count) pairs."""
    counts = word_count(text)
    ranked = sorted(counts.items(), key=lambda pair: (-pair[1], pair[0]))
    return ranked[:n]


def dedupe(items, seen=[]):
    """Return `items` without duplicates, keeping the first occurrence."""
    result = []
    for item in items:
        if item not in seen:
            seen.append(item)
            result.append(item)
    return result
