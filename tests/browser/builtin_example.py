"""The built-in example's inputs (src/explain/builtin_example.cc: films, the genre and value
projections, users' tastes) and the attention worked out from them here, in float64 with plain
Python arithmetic, so that the page's numbers are checked against sums that do not run through
qkv (nor through NumPy's BLAS)."""

import math

FILMS = ["Alien", "Die Hard", "Notting Hill", "Groundhog Day", "The Matrix", "Titanic"]
USERS = ["Ana", "Ben", "Chloe", "Dev"]
GENRES = ["action", "sci-fi", "romance", "comedy"]
GIVES = ["thrill", "laughs", "tears"]

_FILM_FEATURES = [
    [0.2, 1.0, 0.0, 0.1, 0.6],
    [1.0, 0.0, 0.1, 0.4, 0.0],
    [0.0, 0.0, 1.0, 0.8, 0.2],
    [0.1, 0.0, 0.5, 1.0, 0.0],
    [0.8, 0.7, 0.2, 0.1, 0.1],
    [0.0, 0.0, 1.0, 0.0, 1.0],
]
_WK = [[1, 0, 0, 0], [0.3, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0, 0, 0.5, -0.5]]
_WV = [[1, 0.1, 0], [0.8, 0, 0], [0, 0, 0.3], [0, 1, 0], [0.2, 0, 1]]
_USER_TASTES = [[2, 3, 0, 0], [0, 0, 3, 1], [0, 0, 1, 3], [1, 1, 1, 1]]


def _matmul(a, b):
    # Summed left to right over k, as the worked example in the docs does it.
    result = []
    for row in a:
        out_row = []
        for c in range(len(b[0])):
            total = 0.0
            for k, x in enumerate(row):
                total += x * b[k][c]
            out_row.append(total)
        result.append(out_row)
    return result


def builtin_attention(part):
    """Part 0: users (W^Q = I) against films; part 1: films against films (W^Q = W^K).
    Returns a dict of q, k, v, w, o with w the softmax weights at scale 1/sqrt(d_k) = 1/2."""
    k = _matmul(_FILM_FEATURES, _WK)
    v = _matmul(_FILM_FEATURES, _WV)
    q = _USER_TASTES if part == 0 else k
    w = []
    for qi in q:
        scores = []
        for kj in k:
            dot = 0.0
            for c, x in enumerate(qi):
                dot += x * kj[c]
            scores.append(0.5 * dot)
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        total = 0.0
        for e in exps:
            total += e
        w.append([e / total for e in exps])
    return {"q": q, "k": k, "v": v, "w": w, "o": _matmul(w, v)}
